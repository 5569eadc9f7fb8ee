"""Each pipeline rank's own numbers for ``planc verify``: the p2p traffic a rank moves (a middle
rank talks to two neighbours: verify read PP 4's middle ranks -50 % against the busiest pair's
volume) and the memory of the rank itself, not the representative stage that bounds it (a PP 4
1F1B third rank holds a micro-batch fewer in flight than the second: +18 %). Derived by hand."""

from __future__ import annotations

from planc.cost.context import ContextCache, build_context
from planc.cost.profile import PLANC_RUNTIME, PLANC_RUNTIME_CPU, on_hardware
from planc.dsl.load import load_plan_text
from planc.spec import Layout
from planc.stages import rank_boundaries
from planc.strategies.registry import load_registry
from planc.verify.predicted import estimate_for, stage_for

REGISTRY = load_registry()

PLAN = """
model "tiny" {
  layers = 4
  hidden = 128
  heads = 4
  vocab = 256
  seq_len = 64
  mlp = gelu
  norm = layernorm
  position = learned
}
hardware { device = "cpu"  nodes = 1  per_node = 4 }
train { global_batch = 8  micro_batch = 2  precision = fp32  data = synthetic }
layout { tp = 1  pp = 4  dp = 1  zero = 0  recompute = none  schedule = 1f1b }
"""
LAYOUT = Layout(tp=1, pp=4, dp=1, zero=0, recompute="none", schedule="1f1b", micro_batch=2)


def test_boundaries_each_rank_crosses():
    # Looped, v = 1: stage i on rank i; the ends have one neighbour, the middle two.
    assert [rank_boundaries(r, 4, 1) for r in range(4)] == [1, 2, 2, 1]
    # v = 2 over 4 ranks: rank 0 holds stages 0 and 4 (0-1, 3-4, 4-5), rank 1 stages 1 and 5 (four).
    assert [rank_boundaries(r, 4, 2) for r in range(4)] == [3, 4, 4, 3]
    # pp = 2, v = 2: stages 0, 2 on rank 0 and 1, 3 on rank 1: every boundary crosses, three each.
    assert [rank_boundaries(r, 2, 2) for r in range(2)] == [3, 3]
    # V: stages 0, 3 on rank 0 and 1, 2 on rank 1; the turn 1-2 stays on rank 1.
    assert [rank_boundaries(r, 2, 2, "v") for r in range(2)] == [2, 2]


def test_a_middle_rank_moves_twice_the_p2p_bytes_of_an_end():
    plan = load_plan_text(PLAN, "pp4.plan", strategies=REGISTRY)
    _, est = estimate_for(plan, LAYOUT, REGISTRY)
    pp = est.comm_of("pp")
    # The boundary: the fp32 residual stream of a micro-batch, 2 x 64 tokens x 128 x 4 B = 65,536;
    # 4 micro-batches, each an activation one way and a gradient back: 524,288 per boundary.
    per_boundary = 2 * 4 * 65_536
    ends, middle = pp.volume_of_pp_rank(0), pp.volume_of_pp_rank(1)
    assert middle - ends == per_boundary
    assert pp.volume_of_pp_rank(2) == middle and pp.volume_of_pp_rank(3) == ends
    assert pp.volume == ends  # the busiest pair's link, which prices the step


def test_verify_holds_each_rank_against_its_own_stage():
    plan = load_plan_text(PLAN, "pp4.plan", strategies=REGISTRY)
    ctx, est = estimate_for(plan, LAYOUT, REGISTRY)
    assert [s.rank for s in est.stages] == [0, 1, 2, 3]
    # 1F1B: rank i holds pp - i micro-batches in flight, one block each.
    assert [stage_for(ctx, est, r)[0].act_layers for r in range(4)] == [4, 3, 2, 1]


def test_a_cpu_plan_keeps_its_context_cache_and_is_priced_with_the_fused_optimizer():
    # on_hardware of an adapted profile is that profile, so build_context keeps the cache it is
    # handed (an equal copy made it build a new one for every layout, pricing torch's foreach
    # AdamW, which planc's CPU program does not run).
    assert on_hardware(on_hardware(PLANC_RUNTIME, True), True) is PLANC_RUNTIME_CPU
    plan = load_plan_text(PLAN, "pp4.plan", strategies=REGISTRY)
    cache = ContextCache(plan, PLANC_RUNTIME)
    ctx = build_context(plan, LAYOUT, cache.profile, cache)
    assert ctx.profile is cache.profile and ctx.profile.optimizer_kernel == "fused"


def test_each_rank_moves_its_own_tensor_parallel_traffic():
    # TP 2 x PP 2 with SP and learned positions: both stages hold 2 blocks; the embedding's
    # reduce-scatter and all-gather on the first are the head's on the last; only the first
    # all-gathers the position table for the sequence shards, r s h = 4 x 64 x 128 bytes, half of
    # it sent by each of the 2 ranks, once per micro-batch (4). Verify read the last stage +3.2 %
    # against the first's volume (bf16, 4 processes); -0.3 % since.
    text = (
        PLAN.replace("pp = 4", "pp = 2")
        .replace("tp = 1", "tp = 2")
        .replace("schedule = 1f1b", "schedule = 1f1b  sequence_parallel = true")
    )
    plan = load_plan_text(text, "tp2-pp2.plan", strategies=REGISTRY)
    layout = Layout(tp=2, pp=2, dp=1, zero=0, recompute="none", schedule="1f1b", micro_batch=2, sequence_parallel=True)
    _, est = estimate_for(plan, layout, REGISTRY)
    tp = est.comm_of("tp")
    assert tp.volume_of_pp_rank(0) - tp.volume_of_pp_rank(1) == 4 * (4 * 64 * 128) / 2
    assert tp.volume == tp.volume_of_pp_rank(0)  # the busiest rank's, which prices the step


def test_each_rank_reduces_its_own_stages_gradients():
    # DDP in fp32 over 2 data-parallel ranks under PP 2: each rank's ring all-reduce sends
    # 2 (d - 1) / d x 4 bytes of every gradient of its stage, 4 bytes per parameter, where verify
    # read every stage against the busiest (PP 2 x ZeRO-2 x DP 2 interleaved: +1.8 % on the second).
    text = PLAN.replace("pp = 4", "pp = 2").replace("dp = 1", "dp = 2")
    plan = load_plan_text(text, "pp2-dp2.plan", strategies=REGISTRY)
    layout = Layout(tp=1, pp=2, dp=2, zero=0, recompute="none", schedule="1f1b", micro_batch=2)
    ctx, est = estimate_for(plan, layout, REGISTRY)
    dp = est.comm_of("dp")
    assert [dp.volume_of_pp_rank(r) for r in range(2)] == [4 * ctx.stage(r).params for r in range(2)]
    assert ctx.stage(0).params != ctx.stage(1).params
