"""What FSDP keeps of a zero-bubble rank's gradients at a moment of torch's order
(planc.cost.data_parallel.moment_gradients), by hand, on the tiny plan that
tests/verify/test_simulate_pipeline.py simulates: PP 4 x DP 2, two stages of one block per rank,
bf16 over ZeRO-2.

Its block (hidden 512, ffn 2048) holds b = 3,152,384 parameters: two layernorms 2,048; wq, wk,
wv, wo with bias 4 x 262,656; w1 1,050,624; w2 1,049,088. In fp32 a stage's accumulation is
A = 4 b = 12,609,536 B, in bf16 its gradients 2 b = 6,304,768 B. The embedding root: token
embedding 512 x 512 and learned positions 64 x 512 = 294,912; the head root: final norm 1,024 and
the head 512 x 512 = 263,168.
"""

from planc.cost import build_context
from planc.cost.data_parallel import moment_gradients
from planc.dsl.load import load_plan_text
from planc.spec import Layout
from planc.strategies.registry import load_registry
from planc.zero_bubble import ZeroBubbleMoment

BLOCK, EMBEDDING, HEAD = 3_152_384, 294_912, 263_168

PLAN = """
model {
  layers = 8  hidden = 512  heads = 4  vocab = 512  seq_len = 64
  mlp = gelu  norm = layernorm  position = learned
}
hardware { device = "cpu"  nodes = 2  per_node = 4 }
train { global_batch = 8  micro_batch = 1  precision = bf16  optimizer = adamw  steps = 10 }
layout { tp = 1  pp = 4  dp = 2  zero = 2  schedule = zero-bubble  virtual_stages = 2  recompute = none }
"""


def _context(zbv: bool):
    registry = load_registry()
    text = PLAN + ('use pipeline { zero_bubble = "zbv" }\n' if zbv else "")
    plan = load_plan_text(text, "tiny.plan", strategies=registry)
    layout = Layout(tp=1, pp=4, dp=2, zero=2, recompute="none", schedule="zero-bubble", virtual_stages=2, micro_batch=1)
    ctx = build_context(plan, layout, stage_style="v" if zbv else "looped")
    assert ctx.stage(0).layer_params == BLOCK
    return ctx


def test_a_reduced_stage_holds_its_sharded_gradients_not_its_accumulation():
    # Looped, 4 micro-batches (one round), rank 0 (stages 0 and 4) in 0W1: stage 4 is reduced
    # (its sharded gradients A / 2 made, its accumulation and gathered block freed), stage 0
    # accumulates. Against every stage's accumulation, absent: A - A / 2 + 2 b = 12,609,536 B --
    # not the accumulation once more (it was counted as missing twice: 25,219,072).
    moment = ZeroBubbleMoment(3, 0, 0, running_grads=False, weight_pass=True, accumulations=1, reduced=1)
    kept = moment_gradients(_context(zbv=False), 0, moment)
    assert kept.absent == 4 * BLOCK - 2 * BLOCK + 2 * BLOCK == 12_609_536
    assert kept.new == 2 * BLOCK  # stage 0's weight pass is its whole backward: a block's gradients


def test_zbv_rank_0_keeps_each_root_with_its_own_stage():
    # ZB-V, 4 micro-batches, rank 0 (stages 0 and 7) in 7I3: the head's stage 7 accumulates (its
    # block's and the head's), with 7W2's gradients in bf16 beside; stage 0 and the embedding have
    # nothing yet. Absent: stage 0's A and the embedding's 4 x 294,912; own: 2 (b + 263,168).
    moment = ZeroBubbleMoment(5, 1, 0, input_pass=True, accumulations=1, running=0)
    ctx = _context(zbv=True)
    kept = moment_gradients(ctx, 0, moment)
    assert kept.absent == 4 * BLOCK + 4 * EMBEDDING == 13_789_184
    assert kept.own == 2 * (BLOCK + HEAD) == 6_831_104
    assert kept.new == 0
    # In 0W0, after REDUCE_GRAD of stage 7: stage 7 holds its sharded gradients (its block and the
    # head resharded), stage 0 none yet, and its weight pass (its whole backward) a block's new ones.
    moment = ZeroBubbleMoment(4, 0, 0, 0, False, True, accumulations=0, reduced=1, running=1)
    kept = moment_gradients(ctx, 0, moment)
    reduced_stage = 4 * (BLOCK + HEAD) - 2 * (BLOCK + HEAD) + 2 * (BLOCK + HEAD)
    assert kept.absent == 4 * BLOCK + reduced_stage + 4 * EMBEDDING == 27_451_392
    assert (kept.own, kept.new) == (0, 2 * BLOCK)


def test_in_fp32_a_weight_pass_writes_into_the_accumulation_itself():
    # The same plan in fp32: nothing waits in compute precision, so FSDP keeps no gradients apart
    # (own, new 0) and a stage accumulates from its first weight pass. One round, rank 0 in 0W1 as
    # above: stage 4 reduced (A - A / 2 absent, its block resharded: 4 b), stage 0 accumulating.
    registry = load_registry()
    plan = load_plan_text(PLAN.replace("precision = bf16", "precision = fp32"), "tiny32.plan", strategies=registry)
    layout = Layout(tp=1, pp=4, dp=2, zero=2, recompute="none", schedule="zero-bubble", virtual_stages=2, micro_batch=1)
    ctx = build_context(plan, layout)
    moment = ZeroBubbleMoment(3, 0, 0, running_grads=False, weight_pass=True, accumulations=1, reduced=1)
    kept = moment_gradients(ctx, 0, moment)
    assert kept.absent == 4 * BLOCK - 2 * BLOCK + 4 * BLOCK
    assert (kept.own, kept.new) == (0, 0)


def test_in_fp32_every_zero_bubble_moment_accumulates_from_the_weight_pass():
    from planc.zero_bubble import zero_bubble_moments

    for p, v, m, style in ((4, 2, 4, "looped"), (4, 2, 8, "looped"), (4, 2, 4, "v"), (4, 2, 16, "v")):
        for rank in range(p):
            mixed = zero_bubble_moments(p, v, m, rank, style)
            fp32 = zero_bubble_moments(p, v, m, rank, style, weights_wait=False)
            for c in fp32:
                assert c.first_waits == 0 and not c.running_grads
                assert c.accumulations is None or c.accumulations >= 1 or c.input_pass
            if style == "looped":  # the same moments, more stages accumulating
                assert [c.held for c in fp32] == [c.held for c in mixed]
