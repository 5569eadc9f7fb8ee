"""Regenerate the `planc explain` outputs and plan listings pasted into the docs.

A code block preceded by ``<!-- explain: plans/x.plan -->`` is replaced by the output of
``planc explain plans/x.plan``; one preceded by ``<!-- plan: plans/x.plan -->`` by that file's
text. ``tests/test_docs_current.py`` checks the docs match (apart from search timings), so a
change to the cost model that moves a worked example fails until this is run:

    python tools/refresh_docs.py
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("docs/planner.md",)
MARKED_BLOCK = re.compile(r"(<!-- (explain|plan): (\S+) -->\n```[^\n]*\n)(.*?)(```)", re.S)


def explain_text(plan: str) -> str:
    from planc.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["explain", plan])
    return out.getvalue()


def rendered(kind: str, path: str) -> str:
    if kind == "plan":
        return (ROOT / path).read_text(encoding="utf-8")
    return explain_text(path)


def refresh(text: str) -> str:
    return MARKED_BLOCK.sub(lambda m: m.group(1) + rendered(m.group(2), m.group(3)) + m.group(5), text)


def main() -> int:
    import os

    os.chdir(ROOT)  # explain prints the plan path as given: keep it relative
    for name in DOCS:
        path = ROOT / name
        old = path.read_text(encoding="utf-8")
        new = refresh(old)
        if new != old:
            path.write_text(new, encoding="utf-8")
            print(f"updated {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
