"""``layout { shard_group = N }`` (HSDP): legal only where FSDP2's 2-D mesh is what it says."""

import pytest

from planc.spec import Layout, SpecError, build_plan

BASE = {
    "model": {"layers": 4, "hidden": 128, "heads": 4, "vocab": 256, "seq_len": 64},
    "hardware": {"device": "A100-80GB", "nodes": 2, "per_node": 8},
    "train": {"global_batch": 64, "micro_batch": 2},
}


def plan_with(**layout):
    return build_plan({**BASE, "layout": {"tp": 1, "pp": 1, "recompute": "none", **layout}})


def messages(**layout) -> list[str]:
    with pytest.raises(SpecError) as info:
        plan_with(**layout)
    return [i.message for i in info.value.issues if i.path == ("layout", "shard_group")]


def test_shard_group_of_one_node_is_taken_as_written():
    plan = plan_with(dp=16, zero=3, shard_group=8)
    assert plan.layout.shard_group == 8


@pytest.mark.parametrize(
    "layout, words",
    [
        (dict(dp=16, zero=3, shard_group=16), "must divide dp = 16 and be less than it"),  # no replica
        (dict(dp=16, zero=3, shard_group=6), "must divide dp = 16"),  # 16 % 6 != 0
        (dict(dp=16, zero=1, shard_group=8), "needs zero = 2 or 3"),  # nothing sharded to replicate
        (dict(dp="auto", zero=3, shard_group=8), "needs dp and zero fixed"),
    ],
)
def test_shard_group_that_cannot_be_built_is_refused_at_its_key(layout, words):
    assert any(words in m for m in messages(**layout)), messages(**layout)


def test_layout_counts_replicas_and_names_hsdp():
    layout = Layout(tp=1, pp=1, dp=32, zero=3, recompute="none", schedule=None, micro_batch=1, shard_group=8)
    # 32 dp ranks in groups of 8: 32 / 8 = 4 replicas, states sharded 8 ways.
    assert (layout.replicate_groups, layout.shard_degree) == (4, 8)
    assert "HSDP: shard in groups of 8, replicate ×4" in layout.describe()
    with pytest.raises(ValueError, match="tp = 1 and pp = 1"):
        Layout(tp=2, pp=1, dp=8, zero=3, recompute="none", schedule=None, micro_batch=1, shard_group=4)
