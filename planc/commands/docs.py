"""``planc docs [TOPIC]``: the documentation, readable where planc is installed.

The pages in the repository's ``docs/`` are installed with planc (a wheel puts them in
``<prefix>/share/planc/docs``, see ``[tool.setuptools.data-files]``); a source checkout reads
``docs/`` itself. The course's pages (``docs/course/``) are topics too, named ``course/01-one-device``
or by their number alone (``planc docs 8``).
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path

HELP = "list the documentation pages, or print one (planc docs weights)"
DESCRIPTION = "Without TOPIC, list the documentation pages; with one, print it (markdown). --path prints where it is."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "topic", nargs="?", help="a page, e.g. language, getting-started, weights, gpu; a course lesson: course/08 or 8"
    )
    parser.add_argument("--path", action="store_true", help="print the page's file path instead of its text")


def docs_directory() -> Path | None:
    """Where the pages are: a source checkout's docs/, else the installed copy."""
    checkout = Path(__file__).resolve().parents[2] / "docs"
    installed = Path(sysconfig.get_path("data")) / "share" / "planc" / "docs"
    for candidate in (checkout, installed, Path(sys.prefix) / "share" / "planc" / "docs"):
        if candidate.is_dir() and any(candidate.glob("*.md")):
            return candidate
    return None


def run(args: argparse.Namespace) -> int:
    from planc.errors import PlanError, did_you_mean

    directory = docs_directory()
    if directory is None:
        raise PlanError("planc's documentation is not installed here", hint="reinstall planc (pip install planc)")
    pages = {p.stem: p for p in sorted(directory.glob("*.md"))}
    lessons = {f"course/{p.stem}": p for p in sorted(directory.glob("course/[0-9]*.md"))}
    if args.topic is None:
        _list(f"planc documentation ({directory}); read a page with `planc docs TOPIC`:", pages)
        if lessons:
            _list("\nthe course, one lesson a page (`planc docs course/08` or `planc docs 8`):", lessons)
        return 0
    page = _find(args.topic.removesuffix(".md"), pages, lessons)
    if page is None:
        raise PlanError(
            f"no documentation page {args.topic!r}",
            hint=did_you_mean(args.topic, {**pages, **lessons})
            or "pages: " + ", ".join(pages) + "; course lessons 1-20: planc docs course/NN (planc docs lists them)",
        )
    print(page if args.path else page.read_text(encoding="utf-8"), end="\n" if args.path else "")
    return 0


def _list(heading: str, pages: dict[str, Path]) -> None:
    print(heading + "\n")
    width = max(len(name) for name in pages)
    for name, path in pages.items():
        print(f"  {name.ljust(width)}  {_title(path)}")


def _find(topic: str, pages: dict[str, Path], lessons: dict[str, Path]) -> Path | None:
    """A page by name; a lesson by its full name, by ``course/NN`` or by a topic number it covers
    (a lesson titled "8–9. Tensor parallelism" is topics 8 and 9)."""
    if topic in pages or topic in lessons:
        return pages.get(topic) or lessons[topic]
    number = topic.removeprefix("course/").split("-")[0]
    if not number.isdigit():
        return None
    for path in lessons.values():
        first, _, last = _title(path).split(".")[0].partition("–")
        if first.isdigit() and int(first) <= int(number) <= int(last if last.isdigit() else first):
            return path
    return None


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()  # as written: "`planc verify`" keeps both its marks
    return ""
