"""Regenerate every generated part of the docs: the `planc explain` outputs and plan listings
pasted into docs/planner.md, and the tables of docs/language.md.

A code block preceded by ``<!-- explain: plans/x.plan -->`` is replaced by the output of
``planc explain plans/x.plan``; one preceded by ``<!-- plan: plans/x.plan -->`` by that file's
text; the sections between ``<!-- generated:NAME -->`` markers of docs/language.md by
``tools/language_tables.py``; the ``<!-- planc:begin ... -->`` blocks of docs/course/ by
``tools/course_blocks.py`` (``--runs`` also re-runs the stored ``planc run`` outputs there).
``tests/test_docs_current.py``, ``tests/test_course_current.py`` and ``tests/dsl/test_docs.py``
check the docs match (apart from search timings), so a change that moves a worked example or a
key fails until this is run:

    python tools/refresh_docs.py          # add --runs to re-run the course's `planc run` outputs
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("docs/planner.md",)
MARKED_BLOCK = re.compile(r"(<!-- (explain|plan): (\S+) -->\n```[^\n]*\n)(.*?)(```)", re.S)


def explain_text(plan: str) -> str:
    """``planc explain PLAN``'s text, as course_blocks runs it (blind to this machine's verify results)."""
    if str(ROOT / "tools") not in sys.path:
        sys.path.insert(0, str(ROOT / "tools"))
    from course_blocks import planc_output

    return planc_output(["explain", plan])[0]


def rendered(kind: str, path: str) -> str:
    if kind == "plan":
        return (ROOT / path).read_text(encoding="utf-8")
    return explain_text(path)


def refresh(text: str) -> str:
    return MARKED_BLOCK.sub(lambda m: m.group(1) + rendered(m.group(2), m.group(3)) + m.group(5), text)


def main() -> int:
    import os

    os.chdir(ROOT)  # explain prints the plan path as given: keep it relative
    sys.path.insert(0, str(ROOT / "tools"))
    import course_blocks
    import language_tables

    course = {
        str(page.relative_to(ROOT)): course_blocks.refresh for page in sorted((ROOT / "docs/course").glob("*.md"))
    }
    if "--runs" in sys.argv[1:]:
        course = {name: lambda text: course_blocks.refresh(course_blocks.refresh_runs(text)) for name in course}
    updates = {name: refresh for name in DOCS} | {"docs/language.md": language_tables.update} | course
    for name, rewrite in updates.items():
        path = ROOT / name
        old = path.read_text(encoding="utf-8")
        new = rewrite(old)
        if new != old:
            path.write_text(new, encoding="utf-8")
            print(f"updated {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
