"""The planner's rule: the simplest layout that fits, within the tolerance of the fastest."""

import pytest

from planc.explain.words import rejection_reason, suggestion_text
from planc.legality.space import schedule_options, tp_options
from planc.planner import RUNGS, Limit, Rung, choose, complexity, rung_of, search
from planc.spec import Layout, build_plan
from planc.strategies.registry import load_registry


def plan(model=None, nodes=1, per_node=8, device="A100-80GB", gb=64, layout=None, **train):
    return build_plan(
        {
            "model": model or {"preset": "gpt2-medium"},
            "hardware": {"device": device, "nodes": nodes, "per_node": per_node},
            "train": {"global_batch": gb, **train},
            "layout": layout or {},
        }
    )


def L(**kw):
    base = dict(tp=1, pp=1, dp=8, zero=0, recompute="none", schedule=None, micro_batch=1)
    base.update(kw)
    return Layout(**base)


def test_ladder_order():
    ladder = [
        L(tp=1, dp=1),
        L(),
        L(zero=1),
        L(zero=2),
        L(zero=3),
        L(recompute="selective"),
        L(recompute="full"),
        L(tp=2, dp=4),
        L(tp=2, dp=4, sequence_parallel=True),
        L(pp=2, dp=4, schedule="1f1b"),
        L(pp=2, dp=4, schedule="gpipe"),
        L(pp=2, dp=4, schedule="interleaved", virtual_stages=2),
        L(pp=2, dp=4, schedule="zero-bubble"),
    ]
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
    choice = choose(p, load_registry())
    assert choice.fits
    best = choice.best.tokens_per_s
    chosen = choice.estimate.tokens_per_s
    assert chosen >= (1 - choice.tolerance) * best
    result = search(p, load_registry())
    simpler = [c for c in result.fitting if c.complexity < complexity(choice.layout)]
    assert all(c.tokens_per_s < (1 - choice.tolerance) * best for c in simpler)


def test_zero_tolerance_picks_the_fastest_and_wider_tolerance_is_never_more_complex():
    p = plan(model={"preset": "llama2-7b", "seq_len": 2048}, device="H100-SXM", gb=64)
    exact, loose = choose(p, load_registry(), tolerance=0.0), choose(p, load_registry(), tolerance=0.3)
    assert exact.estimate.tokens_per_s == pytest.approx(exact.best.tokens_per_s)
    assert complexity(loose.layout) <= complexity(exact.layout)


def test_fixed_keys_are_obeyed():
    p = plan(layout={"tp": 2, "zero": 1}, micro_batch=2)
    choice = choose(p, load_registry())
    assert (choice.layout.tp, choice.layout.zero, choice.layout.micro_batch) == (2, 1, 2)


def test_a_fully_fixed_layout_is_evaluated_as_given_even_if_it_does_not_fit():
    # llama2-7b on one 80 GiB GPU with DDP: states alone 16 B x 6.7e9 = 108 GB > 80 GiB
    p = plan(
        model={"preset": "llama2-7b", "seq_len": 2048},
        per_node=1,
        gb=8,
        layout={"tp": 1, "pp": 1, "dp": 1, "zero": 0, "recompute": "full"},
        micro_batch=1,
    )
    choice = choose(p, load_registry())
    assert choice.fixed and not choice.fits
    assert (choice.layout.tp, choice.layout.dp, choice.layout.recompute) == (1, 1, "full")
    assert choice.estimate.memory_bytes > choice.estimate.capacity
    assert choice.suggestion and "short by" in suggestion_text(choice.suggestion)


def test_nothing_fits_says_what_would():
    p = plan(model={"preset": "llama2-70b", "seq_len": 2048}, per_node=2, gb=8)
    choice = choose(p, load_registry())
    assert not choice.fits
    # 70B x 16 B = 1.1 TB of states: two 80 GiB devices are far too few; the answer names a count
    assert choice.suggestion.nodes is not None  # a larger cluster of the same nodes fits
    assert "devices" in suggestion_text(choice.suggestion) and choice.estimate.memory_bytes > choice.estimate.capacity


def test_why_not_simpler_has_numbers():
    # 7B on 8 x A100-80GB: DDP needs 16 B/param = 108 GB of states alone
    p = plan(model={"preset": "llama2-7b", "seq_len": 2048}, gb=64)
    choice = choose(p, load_registry())
    rows = {r.rung: r for r in choice.rejected}
    assert rows[Rung.DDP].fits is False
    assert rows[Rung.DDP].limit in (Limit.MEMORY, Limit.FAMILY_MEMORY, Limit.MODEL_STATES)
    assert rows[Rung.DDP].memory_bytes > rows[Rung.DDP].capacity_bytes
    assert all(rejection_reason(r) for r in choice.rejected)
    assert [r.strategy for r in choice.rejected] == [s for s in RUNGS[1 : rung_of(choice.layout)]]


@pytest.mark.parametrize(
    "fixed,holds",
    [
        ({"schedule": "gpipe"}, lambda lay: lay.pp > 1 and lay.schedule == "gpipe"),
        (
            {"schedule": "interleaved", "virtual_stages": 4},
            lambda lay: lay.schedule == "interleaved" and lay.virtual_stages == 4,
        ),
        ({"virtual_stages": 2}, lambda lay: lay.pp > 1 and lay.virtual_stages == 2),
        ({"sequence_parallel": True}, lambda lay: lay.tp > 1 and lay.sequence_parallel),
        ({"zero": 3}, lambda lay: lay.dp > 1 and lay.zero == 3),
    ],
)
def test_a_fixed_key_is_never_dropped_to_make_room(fixed, holds):
    # gpt2 (124 M) fits one GPU, so without the rule the planner's simplest answer (pp = 1,
    # tp = 1) would silently leave each of these keys out.
    p = plan(model={"preset": "gpt2"}, gb=480, layout=fixed)
    choice = choose(p, load_registry())
    assert choice.fits and holds(choice.layout), choice.layout.describe()
    assert all(holds(c.layout) for c in search(p, load_registry()).fitting)


def test_rungs_a_fixed_key_excludes_say_so():
    p = plan(model={"preset": "gpt2"}, gb=480, layout={"schedule": "gpipe"})
    rows = {r.rung: r for r in choose(p, load_registry()).rejected}
    assert rows[Rung.DDP].limit == rows[Rung.PP_1F1B].limit == Limit.EXCLUDED
    assert rows[Rung.DDP].keys == rows[Rung.PP_1F1B].keys == ("schedule = gpipe",)
    assert rejection_reason(rows[Rung.DDP]) == "excluded by the plan: it fixes schedule = gpipe"


def test_the_tp_rung_names_the_arithmetic_that_rules_it_out():
    # 12 CPU processes (3 nodes x 4), global_batch 7 (prime): without pipelining dp = 12 / tp is
    # 6 or 3 (tp 2 or 4 inside a node of 4) and divides 7 in neither case, so TP alone is out;
    # the chosen layout has TP *and* PP. tp = 3 would straddle nodes and is never tried.
    p = plan(model={"preset": "gpt2"}, device="cpu", nodes=3, per_node=4, gb=7)
    choice = choose(p, load_registry())
    assert choice.layout.pp > 1 and choice.layout.tp in (2, 4)
    rows = {r.rung: r for r in choice.rejected}
    assert rows[Rung.TP].limit == Limit.BATCH_SPLIT and rows[Rung.TP].degrees == (3, 6)
    reasons = {r.strategy: rejection_reason(r) for r in choice.rejected}
    assert reasons["+ TP"] == (
        "not possible: covering the 12 devices without pipelining needs dp = 3 or 6, "
        "which does not divide global_batch = 7"
    )
    assert reasons["DDP"] == (
        "not possible: covering the 12 devices by data parallelism alone needs dp = 12, "
        "more than global_batch = 7 sequences"
    )
    assert all(c.layout.tp in (1, 2, 4) for c in search(p, load_registry()).fitting)


def test_zero_bubble_is_never_tried_with_recompute():
    # torch's selective activation checkpointing lets a region run backward once; zero-bubble's split
    # backward runs it twice, and a real run stops at its first step; under full checkpointing its
    # weight pass reruns every block once per parameter group, holding the reruns at once
    # (bench/split_backward_recompute.py; docs/strategies.md)
    p = plan(model={"preset": "llama2-7b", "seq_len": 4096}, nodes=2, gb=64, layout={"pp": 2})
    fitting = search(p, load_registry()).fitting
    assert any(c.layout.schedule == "zero-bubble" for c in fitting)
    assert {"selective", "full"} <= {c.layout.recompute for c in fitting}
    assert not [c.layout for c in fitting if c.layout.schedule == "zero-bubble" and c.layout.recompute != "none"]
