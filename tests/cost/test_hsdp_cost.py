"""The cost of HSDP (``shard_group``): FSDP's traffic inside the shard group plus an all-reduce of
the gradient shard across replicas, and model states sharded over the group only."""

import pytest

from planc.cost import evaluate
from planc.cost.context import ContextCache
from planc.spec import Layout, build_plan
from planc.strategies.registry import load_registry

NODES, PER_NODE = 4, 8


def plan():
    return build_plan(
        {
            "model": {"preset": "gpt2-medium"},
            "hardware": {"device": "A100-80GB", "nodes": NODES, "per_node": PER_NODE},
            "train": {"global_batch": 32, "precision": "bf16"},
        }
    )


def fsdp(dp: int, shard_group: int | None = None) -> Layout:
    return Layout(tp=1, pp=1, dp=dp, zero=3, recompute="none", schedule=None, micro_batch=1, shard_group=shard_group)


def estimate(layout: Layout):
    p = plan()
    return evaluate(p, layout, load_registry().passes(p, layout))


def test_hsdp_traffic_by_hand():
    # dp 32 = 4 replicas x shard groups of 8 (one node each); one micro-batch per step (32 / 32).
    # Per step, each rank sends (ring collectives, Thakur et al. 2005):
    #   ZeRO-3 all-gathers bf16 parameters twice (fwd + bwd):  2 x (7/8) x 2 B x psi
    #   reduce-scatter of fp32 gradients in the shard group:   1 x (7/8) x 4 B x psi
    #   ring all-reduce of the 1/8 fp32 gradient shard over 4:  2 x (3/4) x 4 B x psi / 8
    # psi: the plain FSDP volume over all 32 ranks is (31/32) x (2 x 2 + 4) B x psi.
    plain = estimate(fsdp(32)).comm_of("dp")
    psi = plain.volume / (31 / 32 * (2 * 2 + 4))
    assert psi == pytest.approx(plan().model.params, rel=0.01)  # one stage holds the whole model
    hybrid = estimate(fsdp(32, shard_group=8)).comm_of("dp")
    expected = 7 / 8 * (2 * 2 + 4) * psi + 2 * 3 / 4 * 4 * psi / 8
    assert hybrid.volume == pytest.approx(expected)
    assert "all-reduce of the 1/8 gradient shard across 4 replicas" in hybrid.detail
    # Gathers and reduce-scatters stay on NVLink; only the small shard all-reduce crosses nodes,
    # so HSDP's DP time is below plain FSDP's whose every collective spans the 4 nodes.
    assert hybrid.medium == "nvlink" and hybrid.total < plain.total


def test_hsdp_groups_and_links():
    links = ContextCache(plan()).links(fsdp(32, shard_group=8))
    shard, replicate = links["dp_shard"], links["dp_replicate"]
    assert (shard.size, shard.nodes) == (8, 1)  # ranks 0..7: one node
    assert (replicate.size, replicate.nodes, replicate.per_node) == (4, 4, 1)  # ranks 0, 8, 16, 24


def test_hsdp_shards_model_states_over_the_group_only():
    # Each replica holds a full set of states, sharded 8 ways: the same per-device model states as
    # plain FSDP over 8 ranks, and more than FSDP over all 32.
    hybrid = estimate(fsdp(32, shard_group=8)).stages[0].model_states
    assert hybrid == pytest.approx(estimate(fsdp(8)).stages[0].model_states)
    assert hybrid > 3.5 * estimate(fsdp(32)).stages[0].model_states
