import multiprocessing.process
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Under pytest-xdist each worker computes on one thread (read by torch when a test first imports it,
# after this file). Left at torch's default, one thread per core, the single-process worker took
# both cores from the worker whose launches are the suite's longest path: the whole suite ran in
# 807 s with the default and 740 s with one thread, one after the other on this 2-core machine.
# Launched ranks already get one each (torchrun's default; tests/ranks.py sets it).
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
PLANS = ROOT / "plans"


@pytest.fixture
def root() -> Path:
    return ROOT


PROCESS_GROUP = "starts-processes"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``--dist loadgroup``, the project's default), every ``dist`` test goes to
    one worker, so no two launches ever share the 2 cores: the fault tests' hang deadlines and
    heartbeats were set for one launch at a time. The single-process tests spread over the
    workers beside them.

    ``tryfirst``: xdist reads the ``xdist_group`` marks in its own hook of this name (it appends
    the group to each test's id, which is what the scheduler groups by)."""
    for item in items:
        if launches(item):
            item.add_marker(pytest.mark.xdist_group(PROCESS_GROUP))


def launches(item) -> bool:
    """A ``dist`` test that starts training processes (or times them): not one marked
    ``dist(launches=False)``, slow in one process or starting tools (mypy, a wheel build), which
    may run beside a launch."""
    mark = item.get_closest_marker("dist")
    return mark is not None and mark.kwargs.get("launches", True)


@pytest.fixture(autouse=True)
def _a_dist_test_keeps_its_xdist_group(request):
    """Under ``--dist loadgroup``, a ``dist`` test whose id lost its group fails, saying why: the
    scheduler would spread the launches over both workers, silently, and the suite ran ~40% longer
    with every fault test's deadline shared (pytest 9.2 with pytest-xdist 3.8,
    pytest-dev/pytest-xdist#1386)."""
    node = request.node
    if not request.config.getoption("loadgroup", default=False) or not launches(node):
        return
    if not node.nodeid.endswith(f"@{PROCESS_GROUP}"):
        pytest.fail(
            f"{node.nodeid} lost its xdist group: this pytest and pytest-xdist do not group tests; "
            "install the versions that pyproject.toml's [test] extra pins"
        )


@pytest.fixture(autouse=True)
def _a_process_needs_the_dist_marker(request, monkeypatch):
    """Every test that starts a process (a subprocess, torchrun, spawned ranks) carries the ``dist``
    marker, so ``pytest -m "not dist"`` is the fast, single-process suite. A test without the
    marker that tries to start one fails here, saying so."""
    if request.node.get_closest_marker("dist") is not None:
        return

    def refuse(*args, **kwargs):
        raise AssertionError(f"{request.node.nodeid} starts a process: mark it @pytest.mark.dist")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)


@pytest.fixture(autouse=True)
def _verify_results_stay_in_the_test(monkeypatch, tmp_path):
    """``planc verify`` keeps its results in ``~/.cache/planc/verify`` and ``explain`` shows them
    beside a plan verified there: a test neither reads what someone verified on this machine nor
    writes there, nor sees another test's results (one that needs a folder of its own sets
    ``PLANC_VERIFY_DIR`` again)."""
    monkeypatch.setenv("PLANC_VERIFY_DIR", str(tmp_path / "verify-results"))
