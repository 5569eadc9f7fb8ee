"""The outputs pasted into docs/course/ are the ones planc produces now, and every course plan
has a page.

Each page's ``<!-- planc:begin ... -->`` blocks are re-rendered (planc explain, in this process,
cached per plan and setting) and compared; a stale page fails with its name. The stored
``planc run`` outputs of topics 17-18 are not re-run here (slow, and their timings vary): only
their plans are checked to parse, except a run that planc refuses before launching (quick and
fixed), which is re-run. Regenerate with ``python tools/refresh_docs.py`` (``--runs`` for the runs).
"""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs" / "course").glob("[0-9][0-9]-*.md"))


def _blocks():
    sys.path.insert(0, str(ROOT / "tools"))
    spec = importlib.util.spec_from_file_location("course_blocks", ROOT / "tools" / "course_blocks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BLOCKS = _blocks()


@pytest.mark.dist(launches=False)  # ~6 s of CPU for ~90 planner searches: the slow half, no launch
@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_course_page_is_current(page, monkeypatch):
    monkeypatch.chdir(ROOT)
    text = page.read_text(encoding="utf-8")
    assert BLOCKS.BLOCK.search(text), f"{page.name} has no generated blocks"
    assert BLOCKS.refresh(text) == text, f"docs/course/{page.name} is out of date: run `python tools/refresh_docs.py`"


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_run_outputs_plans_still_parse(page):
    from planc.dsl.load import load_plan
    from planc.strategies.registry import load_registry

    for plan in BLOCKS.run_plans(page.read_text(encoding="utf-8")):
        load_plan(ROOT / plan, strategies=load_registry())


def test_every_course_plan_is_used_and_every_topic_has_a_page():
    pages = "".join(p.read_text(encoding="utf-8") for p in PAGES)
    for plan in sorted((ROOT / "plans" / "course").glob("*.plan")):
        assert f"plans/course/{plan.name}" in pages, f"{plan.name} is on no course page"
    covered = {int(n) for p in PAGES for n in p.stem.split("-")[0:1]}
    # Pages 08 and 11 each cover two topics (8-9: tensor parallelism, 11-12: pipelines).
    assert covered | {9, 12} >= set(range(1, 21)), f"topics without a page: {set(range(1, 21)) - covered - {9, 12}}"
    index = (ROOT / "docs" / "course" / "README.md").read_text(encoding="utf-8")
    for page in PAGES:
        assert f"({page.name})" in index, f"docs/course/README.md does not link {page.name}"


def _refused_runs():
    """The run blocks of `planc run` that planc refuses before it launches anything (no run directory
    banner in the stored output): quick and the same every time, so re-run here. Topic 18's out-of-memory
    refusal is one; its hint's advice must stay what the page says (docs review, finding 2)."""
    for page in PAGES:
        for m in BLOCKS.BLOCK.finditer(page.read_text(encoding="utf-8")):
            if m.group(2).startswith("run ") and "run directory" not in m.group(3):
                _options, command = BLOCKS.run_command(m.group(2))
                if command.startswith("planc run "):
                    yield pytest.param(command, m.group(3), id=f"{page.stem}: {command}")


@pytest.mark.parametrize(("command", "stored"), list(_refused_runs()))
def test_refused_run_outputs_are_current(command, stored, monkeypatch, capsys):
    from planc.cli import main

    monkeypatch.chdir(ROOT)
    assert main(command.split()[1:]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""  # a refusal writes standard error only: its order needs no interleaving
    expected = BLOCKS.fenced(f"$ {command}\n{BLOCKS.masked(captured.err, [])}(exit status 1)\n")
    assert stored == expected, "a stored refusal is out of date: run `python tools/refresh_docs.py --runs`"
