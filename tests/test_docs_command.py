"""``planc docs``: the pages and the course's lessons, found by name or by topic number."""

from pathlib import Path

from planc.cli import main

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_listing_names_every_page_and_every_lesson(capsys):
    assert main(["docs"]) == 0
    out = capsys.readouterr().out
    for page in DOCS.glob("*.md"):
        assert f"  {page.stem} " in out
    for lesson in (DOCS / "course").glob("[0-9]*.md"):
        assert f"  course/{lesson.stem} " in out


def test_a_title_that_ends_in_code_keeps_both_its_marks(capsys):
    # docs/verify.md: "# Checking a prediction: `planc verify`" (its closing mark was dropped, leaving one)
    assert main(["docs"]) == 0
    assert "Checking a prediction: `planc verify`\n" in capsys.readouterr().out


def test_a_lesson_is_found_by_name_and_by_every_topic_number_it_covers(capsys):
    # 08-tensor-parallel.md is titled "8–9. Tensor parallelism, ..." (two topics of the course, one page).
    for topic in ("course/08-tensor-parallel", "course/08", "8", "9"):
        assert main(["docs", topic, "--path"]) == 0
        assert capsys.readouterr().out.strip() == str(DOCS / "course" / "08-tensor-parallel.md"), topic


def test_an_unknown_topic_is_refused_with_the_pages_named(capsys):
    assert main(["docs", "21"]) == 1
    err = capsys.readouterr().err
    assert "no documentation page '21'" in err and "course lessons 1-20" in err and "Traceback" not in err
