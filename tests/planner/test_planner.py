"""The planner's rule: the simplest layout that fits, within the tolerance of the fastest."""

import pytest

from planc.planner import RUNGS, choose, complexity, rung_of, search
from planc.planner.space import schedule_options, tp_options
from planc.spec import Layout, build_plan


def plan(model=None, nodes=1, per_node=8, device="A100-80GB", gb=64, layout=None, **train):
    return build_plan({"model": model or {"preset": "gpt2-medium"},
                       "hardware": {"device": device, "nodes": nodes, "per_node": per_node},
                       "train": {"global_batch": gb, **train}, "layout": layout or {}})


def L(**kw):
    base = dict(tp=1, pp=1, dp=8, zero=0, recompute="none", schedule=None, micro_batch=1)
    base.update(kw)
    return Layout(**base)


def test_ladder_order():
    ladder = [L(tp=1, dp=1), L(), L(zero=1), L(zero=2), L(zero=3), L(recompute="selective"), L(recompute="full"),
              L(tp=2, dp=4), L(tp=2, dp=4, sequence_parallel=True), L(pp=2, dp=4, schedule="1f1b"),
              L(pp=2, dp=4, schedule="gpipe"), L(pp=2, dp=4, schedule="interleaved", virtual_stages=2),
              L(pp=2, dp=4, schedule="zero-bubble")]
    assert [RUNGS[rung_of(x)] for x in ladder] == list(RUNGS)
    ranks = [complexity(x) for x in ladder]
    assert ranks == sorted(ranks)
    # within a rung: less recomputation, lower ZeRO, smaller degrees first
    assert complexity(L(pp=2, dp=4, schedule="1f1b")) < complexity(L(pp=2, dp=4, schedule="1f1b", zero=1))
    assert complexity(L(tp=2, dp=4)) < complexity(L(tp=4, dp=2))


def test_space_respects_divisibility_and_fixed_keys():
    p = plan(model={"layers": 4, "hidden": 384, "heads": 6, "vocab": 1000, "seq_len": 64})
    # heads 6: tp in {1, 2} (3 does not divide 8 devices, 6 > ... and does not divide world)
    assert tp_options(p) == [1, 2]
    assert tp_options(plan(layout={"tp": 2})) == [2]
    p = plan(model={"layers": 4, "hidden": 256, "heads": 4, "vocab": 1000, "seq_len": 64})
    # pp = 2, 4 layers: v in {2} (pp x v <= layers); zero-bubble also v = 1; GPipe only on request
    assert schedule_options(p, 2) == [("1f1b", 1), ("interleaved", 2), ("zero-bubble", 1), ("zero-bubble", 2)]


def test_the_choice_is_the_simplest_within_tolerance():
    p = plan(model={"preset": "llama2-7b", "seq_len": 2048}, device="H100-SXM", gb=64)
    choice = choose(p)
    assert choice.fits
    best = choice.best.tokens_per_s
    chosen = choice.estimate.tokens_per_s
    assert chosen >= (1 - choice.tolerance) * best
    result = search(p)
    simpler = [c for c in result.fitting if c.complexity < complexity(choice.layout)]
    assert all(c.tokens_per_s < (1 - choice.tolerance) * best for c in simpler)


def test_zero_tolerance_picks_the_fastest_and_wider_tolerance_is_never_more_complex():
    p = plan(model={"preset": "llama2-7b", "seq_len": 2048}, device="H100-SXM", gb=64)
    exact, loose = choose(p, tolerance=0.0), choose(p, tolerance=0.3)
    assert exact.estimate.tokens_per_s == pytest.approx(exact.best.tokens_per_s)
    assert complexity(loose.layout) <= complexity(exact.layout)


def test_fixed_keys_are_obeyed():
    p = plan(layout={"tp": 2, "zero": 1}, micro_batch=2)
    choice = choose(p)
    assert (choice.layout.tp, choice.layout.zero, choice.layout.micro_batch) == (2, 1, 2)


def test_a_fully_fixed_layout_is_evaluated_as_given_even_if_it_does_not_fit():
    # llama2-7b on one 80 GiB GPU with DDP: states alone 16 B x 6.7e9 = 108 GB > 80 GiB
    p = plan(model={"preset": "llama2-7b", "seq_len": 2048}, per_node=1, gb=8,
             layout={"tp": 1, "pp": 1, "dp": 1, "zero": 0, "recompute": "full"}, micro_batch=1)
    choice = choose(p)
    assert choice.fixed and not choice.fits
    assert (choice.layout.tp, choice.layout.dp, choice.layout.recompute) == (1, 1, "full")
    assert choice.estimate.memory_bytes > choice.estimate.capacity
    assert choice.suggestion and "short by" in choice.suggestion


def test_nothing_fits_says_what_would():
    p = plan(model={"preset": "llama2-70b", "seq_len": 2048}, per_node=2, gb=8)
    choice = choose(p)
    assert not choice.fits
    # 70B x 16 B = 1.1 TB of states: two 80 GiB devices are far too few; the answer names a count
    assert "devices" in choice.suggestion and choice.estimate.memory_bytes > choice.estimate.capacity


def test_why_not_simpler_has_numbers():
    # 7B on 8 x A100-80GB: DDP needs 16 B/param = 108 GB of states alone
    p = plan(model={"preset": "llama2-7b", "seq_len": 2048}, gb=64)
    choice = choose(p)
    rows = {r.strategy: r for r in choice.rejected}
    assert rows["DDP"].fits is False
    assert rows["DDP"].memory_bytes > rows["DDP"].capacity_bytes
    assert all(r.reason for r in choice.rejected)
    assert [r.strategy for r in choice.rejected] == [s for s in RUNGS[1:rung_of(choice.layout)]]
