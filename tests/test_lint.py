"""ruff (lint and format) and mypy pass on the tree, with the configuration in pyproject.toml.

They run as processes, so these tests carry the ``dist`` marker: the full suite (and CI) runs
them, ``pytest -m "not dist"`` does not. ruff and mypy come with the ``test`` extra, pinned.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.dist(launches=False)  # mypy and ruff: processes, no training


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    done = run("ruff", "check", ".")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_ruff_format_changes_nothing():
    done = run("ruff", "format", "--check", ".")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_mypy_finds_nothing(tmp_path):
    # A fresh cache directory: a stale cache from another checkout must not hide an error.
    done = run("mypy", "--cache-dir", str(tmp_path / "mypy"))
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_the_linters_are_the_pinned_ones():
    """The versions CI installs are the ones pyproject.toml pins (a new release may add rules)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: pytest brings tomli
        import tomli as tomllib

    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    for tool in ("ruff", "mypy"):
        pinned = next(p.split("==")[1] for p in pins if p.startswith(f"{tool}=="))
        version = run(tool, "--version").stdout
        assert pinned in version, f"{tool} {version.strip()} is installed, pyproject.toml pins {pinned}"
