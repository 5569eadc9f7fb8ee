"""Numbers print readably at any size: past the largest unit (PiB, seconds past 11.6 days) or a
slowdown past 10,000x, they switch to three significant digits in scientific form, not a row of
digits (a 1 MB/s link prices steps of days and slowdowns of 10^5)."""

from planc.explain.words import rejection_reason
from planc.planner.ladder import Rung
from planc.planner.rejections import Limit, Rejection
from planc.spec.layout import Layout
from planc.units import format_bytes, format_seconds


def test_bytes_past_the_largest_unit_are_scientific():
    assert format_bytes(80 * 2**30) == "80.0 GiB"
    assert format_bytes(9999 * 2**50) == "9999.0 PiB"
    # 1e30 GiB = 1e30 x 2^30 B; / 2^50 = 1e30 / 2^20 = 9.5367e23 PiB
    assert format_bytes(1e30 * 2**30) == "9.54e+23 PiB"


def test_seconds_past_a_million_are_scientific():
    assert format_seconds(123.4) == "123 s"
    assert format_seconds(999_999) == "999999 s"
    assert format_seconds(2.2585e300) == "2.26e+300 s"


def test_a_huge_slowdown_is_scientific():
    r = Rejection(
        rung=Rung.DDP,
        limit=Limit.SLOWER,
        fits=True,
        layout=Layout(tp=1, pp=1, dp=8, zero=0, recompute="none", schedule=None, micro_batch=1),
        memory_bytes=2**30,
        step_s=4.81e6,
        slowdown=4.81e6 / 1.5,  # 3,206,667x
        chosen_step_s=1.5,
    )
    assert "fits (1.0 GiB) but 3.21e+06× slower: step 4.81e+06 s vs 1.50 s" in rejection_reason(r)


def test_a_change_that_rounds_to_zero_has_no_sign():
    """explain's alternatives printed "(-0%)" for a layout 0.3% slower (review, finding 10)."""
    from planc.units import format_signed_percent

    assert format_signed_percent(-0.003) == "0%"
    assert format_signed_percent(0.0049) == "0%"
    assert format_signed_percent(0.021) == "+2%"
    assert format_signed_percent(-0.016, 1) == "-1.6%"
    assert format_signed_percent(-0.0004, 1) == "0.0%"


def test_the_alternatives_and_the_notes_measure_a_gap_alike():
    """gpt3-1.3b: the note said ZeRO-2 "would save 91.0 ms (1.6%) per step" (of the chosen step)
    while the list gave the same layout "(+2%)" (of tokens/s), unlabelled. The list now gives the
    step time's change, the note's measure: 5.68 s against 5.77 s is -1.6%."""
    import re
    from dataclasses import replace
    from pathlib import Path

    from planc.dsl.load import load_plan
    from planc.explain.report import render_text
    from planc.planner import choose
    from planc.planner.advice import advise
    from planc.strategies.registry import load_registry

    registry = load_registry()
    plan = load_plan(Path(__file__).resolve().parents[2] / "plans" / "gpt3-1.3b-8xa100.plan", strategies=registry)
    choice = choose(plan, registry)
    text = render_text(plan, replace(choice, advice=advise(plan, choice, registry)))
    saved = re.search(r"ZeRO-2 would save \S+ ms \((\d+\.\d)%\) per step \((.+?)\)", text)
    assert saved, text
    layout = saved.group(2)
    listed = re.search(rf"\d\. {re.escape(layout)}\n +\S+ k tokens/s · step \S+ s \((\S+)\)", text)
    assert listed, text
    assert listed.group(1) == f"-{saved.group(1)}%"
    assert "(-0%)" not in text and "(+0%)" not in text
