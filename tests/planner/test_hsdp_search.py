"""The planner weighs HSDP (one node per shard group) against plain ZeRO-3, and takes it only when
it beats plain ZeRO-3 by more than the margin (it ranks after it on the ladder)."""

import pytest

from planc.cost.context import ContextCache
from planc.explain.report import render_text
from planc.legality import space
from planc.planner import choose
from planc.planner.choose import is_fully_fixed
from planc.planner.explore import evaluate_layout, search
from planc.planner.ladder import complexity
from planc.planner.margin import planner_margin
from planc.spec import Layout, SpecError, build_plan
from planc.strategies.registry import load_registry
from planc.units import Quantity

REGISTRY = load_registry()
PER_NODE = 8


def plan(nodes=2, network=25, micro_batch="auto", **layout):
    """Llama 2 7B on H100 nodes of 8 behind a slow network (25 GB/s per node = 200 Gb/s, a tenth
    of a DGX H100's 8 x 400 Gb/s), one sequence per rank and step, pure data parallelism: every
    step ZeRO-3 gathers all 6.7 B parameters twice and reduce-scatters their gradients."""
    hardware = {
        "device": "H100-SXM",
        "nodes": nodes,
        "per_node": PER_NODE,
        "inter_node_bw_per_node": Quantity.of(network, "GB/s"),
    }
    return build_plan(
        {
            "model": {"preset": "llama2-7b", "seq_len": 4096},
            "hardware": hardware,
            "train": {"global_batch": nodes * PER_NODE, "precision": "bf16", "micro_batch": micro_batch},
            "layout": {"tp": 1, "pp": 1, **layout},
        }
    )


def fsdp(dp: int, shard_group: int | None = None, zero: int = 3) -> Layout:
    return Layout(tp=1, pp=1, dp=dp, zero=zero, recompute="none", schedule=None, micro_batch=1, shard_group=shard_group)


def test_hsdp_wins_where_zero3_gathers_cross_a_slow_network():
    p = plan(shard_group="auto")
    choice = choose(p, REGISTRY)
    assert (choice.layout.zero, choice.layout.dp, choice.layout.shard_group) == (3, 16, PER_NODE)
    # The reason, from the cost model's parts: plain ZeRO-3 runs its gathers and reduce-scatters over
    # the network; HSDP keeps them inside the node (NVLink) and sends only the 1/8 gradient
    # shard's all-reduce across the two nodes. Its DP traffic is what is exposed, and the plain
    # layout is slower by more than the margin (else, ranking simpler, it would be chosen).
    cache = ContextCache(p)
    plain, hybrid = (evaluate_layout(p, fsdp(16, g), REGISTRY, cache) for g in (None, PER_NODE))
    assert plain.comm_of("dp").medium == "network" and hybrid.comm_of("dp").medium == "nvlink"
    assert hybrid.comm_of("dp").exposed < plain.comm_of("dp").exposed
    assert not planner_margin(None).within(plain.step_s, hybrid.step_s)
    assert choice.estimate.step_s <= hybrid.step_s  # the chosen micro-batch / recompute is no worse


def test_explain_words_the_hsdp_choice_and_the_plain_zero3_row():
    p = plan(shard_group="auto")
    choice = choose(p, REGISTRY)
    text = render_text(p, choice)
    assert "HSDP: shard in groups of 8, replicate ×2" in text
    assert "rung: ZeRO-3 (FSDP) + HSDP" in text
    plain_rows = [r for r in choice.rejected if r.strategy == "ZeRO-3 (FSDP)"]
    assert len(plain_rows) == 1 and plain_rows[0].layout.shard_group is None
    assert plain_rows[0].fits and plain_rows[0].slowdown > 1.0
    assert plain_rows[0].grown[0] == "DP exposed"  # the part that grew is the data-parallel traffic


@pytest.mark.parametrize("tolerance", [0.2, 0.7])
def test_hsdp_must_beat_plain_zero3_by_the_margin(tolerance):
    # zero fixed at 3: the choice is between plain ZeRO-3 and HSDP at the same rung.
    p = plan(zero=3, shard_group="auto", tolerance=tolerance)
    choice = choose(p, REGISTRY)
    result = search(p, REGISTRY)

    def fastest(group):
        return max((c for c in result.fitting if c.layout.shard_group == group), key=lambda c: c.tokens_per_s)

    plain, hybrid = fastest(None), fastest(PER_NODE)
    assert complexity(plain.layout) < complexity(hybrid.layout)  # a tie goes to plain ZeRO-3
    assert hybrid.estimate.step_s < plain.estimate.step_s
    # The rule: plain ZeRO-3 is kept while the best's speed-up stays within the tolerance.
    plain_within = hybrid.estimate.step_s / plain.estimate.step_s >= 1 - tolerance
    assert (choice.layout.shard_group is None) == plain_within
    assert plain_within == (tolerance == 0.7)  # 1.4 s against 2.2 s: 36% faster


def test_one_node_never_gets_hsdp():
    p = plan(nodes=1, shard_group="auto")
    assert all(c.layout.shard_group is None for c in search(p, REGISTRY).fitting)
    assert choose(p, REGISTRY).layout.shard_group is None


def test_where_the_search_tries_a_shard_group():
    p = plan(nodes=4)  # dp and zero left to the planner, shard_group unset: the planner weighs HSDP
    assert space.shard_group_options(p, 1, 1, 32, 3) == [None, PER_NODE]
    assert space.shard_group_options(p, 1, 1, 32, 2) == [None]  # only with ZeRO-3
    assert space.shard_group_options(p, 2, 1, 16, 3) == [None]  # only with tp = pp = 1
    assert space.shard_group_options(p, 1, 1, 8, 3) == [None]  # dp inside one node
    written = plan(nodes=4, dp=32, zero=3, recompute="none")
    assert space.shard_group_options(written, 1, 1, 32, 3) == [None]  # dp and zero as written: plain
    fixed = plan(nodes=4, dp=32, zero=3, shard_group=16)
    assert space.shard_group_options(fixed, 1, 1, 32, 3) == [16]


def test_shard_group_auto_is_a_key_left_to_the_planner():
    every_key = dict(dp=16, zero=3, recompute="none", micro_batch=1)
    assert is_fully_fixed(plan(**every_key))  # unset: plain FSDP, as written
    assert not is_fully_fixed(plan(**every_key, shard_group="auto"))
    assert plan(dp="auto", zero="auto", shard_group="auto").layout.shard_group == "auto"


def test_a_fixed_shard_group_still_needs_tp_and_pp_of_one():
    with pytest.raises(SpecError) as info:
        build_plan(
            {
                "model": {"preset": "llama2-7b", "seq_len": 4096},
                "hardware": {"device": "H100-SXM", "nodes": 2, "per_node": PER_NODE},
                "train": {"global_batch": 16},
                "layout": {"tp": 2, "pp": 1, "dp": 8, "zero": 3, "shard_group": 4},
            }
        )
    assert any("tp = 1 and pp = 1" in i.message for i in info.value.issues)


def test_a_fixed_shard_group_is_kept_while_the_planner_fills_the_other_keys():
    # dp and zero fixed beside shard_group = 8; recompute and micro-batch left to the planner:
    # every scored layout keeps the written group (the search used to drop it).
    p = plan(dp=16, zero=3, shard_group=PER_NODE)
    assert {c.layout.shard_group for c in search(p, REGISTRY).fitting} == {PER_NODE}
    assert choose(p, REGISTRY).layout.shard_group == PER_NODE
