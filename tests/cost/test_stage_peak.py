"""Where a stage's memory peaks: the largest phase, with the gradients held only from the first
backward on where every forward comes first (:class:`planc.cost.estimate.StageMemory`).

The numbers are small integers chosen by hand, so each expected total is written out."""

from __future__ import annotations

from planc.cost.estimate import FROM_FIRST_BACKWARD, UNTIL_LATER_LOSS, StageMemory, Term
from planc.dsl.load import load_plan_text
from planc.spec import Layout
from planc.strategies.registry import load_registry
from planc.verify.predicted import estimate_for

REGISTRY = load_registry()

# params 10, optimizer 20, gradients 8; 6 block-micro-batches of 3 bytes (18) in flight.
BASE = dict(rank=0, params=10.0, master=0.0, grads=8.0, optimizer=20.0, act_per_layer=3.0, act_layers=6.0)
TERMS = (
    Term("untagged buffer", 1.0),
    Term("loss", 5.0, "loss"),
    Term("head backward", 7.0, "head backward"),
    Term("recompute working set", 4.0, "backward"),
)


def test_without_first_backward_the_gradients_are_held_throughout():
    s = StageMemory(**BASE, transient=TERMS)
    # the largest phase's own terms (head backward, 7) on top of everything held throughout
    assert s.peak_phase == "head backward"
    assert s.total == 10 + 20 + 8 + 18 + 1 + 7
    assert s.grads_at_peak == 8 and s.block_activations == 18


def test_before_the_first_backward_there_are_no_gradients():
    # GPipe-like: 3 micro-batches of 2 blocks; one micro-batch's backward frees 2 blocks (6 bytes).
    s = StageMemory(**{**BASE, "grads": 5.0}, transient=TERMS, first_backward_frees=2.0, head_grads=1.0)
    # loss (pre-backward): 10 + 20 + 0 + 18 + 1 + 5 = 54
    # head backward: the first micro-batch's, no gradients, 18 of blocks: 10 + 20 + 18 + 1 + 7 = 56;
    #   a later one's, 5 of gradients and 12 of blocks: 17 < 18, so 56
    # backward: start 1 (head) + 18 = 19, end 5 + 12 = 17: 10 + 20 + 19 + 1 + 4 = 54
    assert s.peak_phase == "head backward"
    assert s.total == 56
    assert s.grads_at_peak == 0 and s.block_activations == 18
    # with 8 of gradients a later micro-batch's head backward holds more: 8 + 12 = 20 > 18
    s = StageMemory(**BASE, transient=TERMS, first_backward_frees=2.0, head_grads=1.0)
    assert s.peak_phase == "head backward" and s.total == 10 + 20 + 8 + 12 + 1 + 7


def test_when_the_gradients_outweigh_a_micro_batch_a_moment_after_the_first_backward_is_the_peak():
    s = StageMemory(**{**BASE, "grads": 30.0}, transient=TERMS[:2] + TERMS[3:], first_backward_frees=2.0)
    # backward: end 30 + 12 = 42 beats start 0 + 18: 10 + 20 + 42 + 1 + 4 = 77; loss: the first
    # micro-batch's 10 + 20 + 0 + 18 + 1 + 5 = 54, a later one's 10 + 20 + 30 + 12 + 1 + 5 = 78
    assert s.peak_phase == "loss"
    assert s.total == 78
    assert s.grads_at_peak == 30 and s.block_activations == 12
    s = StageMemory(**{**BASE, "grads": 30.0}, transient=TERMS[:1] + TERMS[3:], first_backward_frees=2.0)
    assert s.peak_phase == "backward" and s.total == 77


def test_terms_held_from_the_first_backward_or_until_a_later_loss():
    # GPipe's last stage, 3 micro-batches of 2 blocks (6 bytes each), gradients 8: an accumulated
    # gradient buffer of 6 exists from the first backward on; the 2 other micro-batches' losses
    # (4 each) wait at the first loss, one of them (the later micro-batch's own) is running at a
    # later loss, where its loss term (5) holds it.
    terms = (
        Term("accumulated gradients", 6.0, held=FROM_FIRST_BACKWARD),
        Term("losses waiting (1 more)", 4.0),
        Term("losses waiting (1 more, until a later loss)", 4.0, held=UNTIL_LATER_LOSS),
        Term("loss", 5.0, "loss"),
    )
    s = StageMemory(**BASE, transient=terms, first_backward_frees=2.0)
    # first loss: 10 + 20 + 0 + 18 + 8 + 5 = 61; a later loss: 10 + 20 + 8 + 12 + 6 + 4 + 5 = 65;
    # the first backward's end (untagged): 10 + 20 + 8 + 12 + 6 + 8 = 64
    assert s.peak_phase == "loss" and s.total == 65
    assert [s.at_peak(t) for t in terms] == [True, True, False, True]
    assert s.transient_bytes == 6 + 4 + 5
    # held throughout (no first_backward_frees): every moment follows a backward, none is a later loss
    s = StageMemory(**BASE, transient=terms)
    assert s.total == 10 + 20 + 8 + 18 + 6 + 8 + 5


def test_an_accumulation_kept_in_place_of_the_gradients():
    # FSDP under a pipeline: the sharded gradients (grads, 8) exist only after the step; from the
    # first backward on the stage holds its accumulation (accumulated_grads) instead.
    s = StageMemory(**BASE, transient=TERMS, accumulated_grads=0.0)
    # none accumulated at the peak (a zero-bubble rank with one round): 10 + 20 + 0 + 18 + 1 + 7
    assert s.peak_phase == "head backward" and s.total == 56
    assert s.grads_at_peak == 0 and s.grads_after_backward == 0 and s.model_states == 10 + 20 + 8
    s = StageMemory(**BASE, transient=TERMS, accumulated_grads=16.0)
    assert s.total == 10 + 20 + 16 + 18 + 1 + 7 and s.grads_at_peak == 16
    # GPipe-like (3 micro-batches of 2 blocks), embedding's sharded gradients 2 of the 8:
    # backward start (before any backward): 0 + 18 = 18; its last block in the first micro-batch:
    # 16 - 2 = 14 + 12 = 26; later loss 16 + 12 = 28 + 5; later head backward 28 + 7 = 35
    s = StageMemory(**BASE, transient=TERMS, first_backward_frees=2.0, embedding_grads=2.0, accumulated_grads=16.0)
    assert s.peak_phase == "head backward" and s.total == 10 + 20 + 16 + 12 + 1 + 7
    # an accumulation smaller than the embedding's share: none at that moment, not -1
    s = StageMemory(**BASE, transient=TERMS[3:], first_backward_frees=2.0, embedding_grads=2.0, accumulated_grads=1.0)
    # (backward start, its last block: max(0, 8 - 2 - 8 + 1), the forward's end, the embedding's backward)
    assert [m.grads for m in s._moments(["backward"])] == [0.0, 0.0, 0.0, 1.0]
    # backward start 0 + 18 + 4 beats its last block 0 + 12 + 4 and the step's end 1 + 12
    assert s.peak_phase == "backward" and s.total == 10 + 20 + 18 + 4


def test_the_embeddings_gradient_comes_after_every_block_backward():
    # One micro-batch of 6 blocks under recompute: 1 byte of activations per block, a working set of
    # 4 while a block runs backward; gradients 30, of which the embedding's 12 come last.
    s = StageMemory(
        **{**BASE, "grads": 30.0, "act_per_layer": 1.0},
        transient=TERMS[3:],
        first_backward_frees=6.0,
        embedding_grads=12.0,
    )
    # backward: start 0 + 6, last block 18 + 0: 10 + 20 + 18 + 4 = 52; the embedding's: 10 + 20 + 30 = 60
    assert s.peak_phase == "" and s.total == 60 and s.grads_at_peak == 30
    s = StageMemory(**{**BASE, "grads": 30.0, "act_per_layer": 1.0}, transient=TERMS[3:], first_backward_frees=6.0)
    assert s.peak_phase == "backward" and s.total == 10 + 20 + 30 + 4  # without the split: over by 4


def test_one_micro_batch_has_no_later_head_backward():
    # One micro-batch of 6 blocks frees all of them: the head's backward only runs before any gradient.
    s = StageMemory(**{**BASE, "grads": 30.0}, transient=TERMS[2:3], first_backward_frees=6.0)
    # head backward: 10 + 20 + 18 + 7 = 55 (not 30 + 0 + 7); the bare backward: max(0 + 18, 30 + 0) = 30 -> 60
    assert s.peak_phase == "backward"
    assert s.total == 10 + 20 + 30 + 0
    s = StageMemory(**BASE, transient=TERMS[2:3], first_backward_frees=6.0)
    assert s.peak_phase == "head backward" and s.total == 10 + 20 + 18 + 7


PLAN = """
model "small" {{
  layers = 4
  hidden = 256
  heads = 4
  vocab = 512
  seq_len = 512
}}
hardware {{
  device = "cpu"
  nodes = 1
  per_node = {dp}
}}
train {{
  global_batch = {batch}
  micro_batch = 8
  precision = {precision}
}}
layout {{
  tp = 1
  pp = 1
  dp = {dp}
}}
"""


def _worst(dp: int, batch: int, precision: str) -> StageMemory:
    plan = load_plan_text(PLAN.format(dp=dp, batch=batch, precision=precision), "small.plan", strategies=REGISTRY)
    layout = Layout(tp=1, pp=1, dp=dp, zero=0, recompute="none", schedule=None, micro_batch=8)
    return estimate_for(plan, layout, REGISTRY)[1].memory


def test_one_micro_batch_per_step_peaks_before_its_gradients_exist():
    """Measured with `planc verify` on this machine (one process, fp32, docs/verify.md): 329.2 MiB
    with one micro-batch per step and 342.8 with two, 13.6 MiB apart -- the gradients exactly."""
    one, two = _worst(1, 8, "fp32"), _worst(1, 16, "fp32")
    assert one.grads_at_peak == 0 and two.grads_at_peak == two.grads
    assert two.total - one.total > 0.9 * one.grads


def test_ddp_buckets_hold_the_gradients_before_the_first_backward():
    """fp32 DDP makes every gradient a view into its buckets at once (gradient_as_bucket_view);
    bf16 data parallelism runs ``replicate``, whose gradients the backward makes."""
    assert _worst(2, 16, "fp32").grads_at_peak > 0
    assert _worst(2, 16, "bf16").grads_at_peak == 0


def test_micro_batches_holding_logits_by_schedule():
    from planc.cost.memory import micro_batches_holding_logits as holding

    assert holding(None, 1, 8, "chunked") == 1  # no pipeline: one micro-batch at a time
    assert holding("1f1b", 4, 8, "chunked") == 1  # the last stage's backward follows its forward
    assert holding("gpipe", 4, 8, "chunked") == 8  # every forward first
    assert holding("zero-bubble", 4, 8, "chunked_recompute") == 8  # kept to the step's end
    assert holding("zero-bubble", 4, 8, "chunked") == 4  # to each one's weight pass: p in flight
    assert holding("zero-bubble", 4, 2, "chunked") == 2  # no more than the step has
    assert holding("zero-bubble", 4, 8, "chunked", "v") == 1  # ZB-V's head stage: F, I, W back to back


def _pipeline_terms(schedule: str, batch: int) -> dict[int, dict[str, tuple[float, str]]]:
    text = PLAN.format(dp=2, batch=batch, precision="fp32").replace("pp = 1", "pp = 2").replace("dp = 2", "dp = 1")
    text = text.replace("dp = 1\n}", f"dp = 1\n  schedule = {schedule}\n}}").replace(
        "hidden = 256", "hidden = 256\n  ffn = 1024"
    )
    plan = load_plan_text(text, "small-pp.plan", strategies=REGISTRY)
    layout = Layout(tp=1, pp=2, dp=1, zero=0, recompute="none", schedule=schedule, micro_batch=8)
    est = estimate_for(plan, layout, REGISTRY)[1]
    return {s.rank: {t.name: (t.value, t.phase) for t in s.transient} for s in est.stages}


def test_a_pipeline_stage_holds_its_outputs_in_flight_and_a_blocks_backward_temporaries():
    """Hand-derived for the small model (hidden 256, ffn 4 x 256, micro-batch 8 x 512 tokens, fp32):
    a stage output is 8 x 512 x 256 x 4 bytes; 1F1B's first of two stages has 2 micro-batches in
    flight, GPipe's all 4; the last stage's output is the loss. A block's backward starts with its
    MLP output projection's input gradient (4096 x 1024) and weight gradient (256 x 1024)."""
    output = 8 * 512 * 256 * 4
    backward = 4 * 1024 * (8 * 512 + 256)
    for schedule, in_flight in (("1f1b", 2), ("gpipe", 4)):
        terms = _pipeline_terms(schedule, batch=32)
        first = {name: v for name, v in terms[0].items() if name.startswith("stage outputs")}
        assert list(first.values()) == [(in_flight * output, "")], (schedule, terms[0])
        assert not any(name.startswith("stage outputs") for name in terms[1]), terms[1]
        for rank in (0, 1):
            assert terms[rank]["block backward: the MLP output projection's gradients"] == (
                backward,
                "backward",
            )


VOCAB_HEAVY = """
model "tiny" {
  layers = 2
  hidden = 128
  heads = 4
  vocab = 8192
  seq_len = 64
  mlp = gelu
  norm = layernorm
  position = learned
}
hardware { device = "cpu"  nodes = 2  per_node = 4 }
train { global_batch = 16  micro_batch = 1  precision = fp32  optimizer = adamw  steps = 10 }
layout { tp = 1  pp = 1  dp = 8  zero = ZERO  recompute = none }
"""

# The model's parameters, by hand (tests/verify/test_simulate.py's block): a block 198,272; the
# root unit: token embedding 8192 x 128 = 1,048,576, positions 64 x 128 = 8,192, final norm 256,
# head 8192 x 128 = 1,048,576 -- 2,105,600, of them the head and final norm 1,048,832.
BLOCK, ROOT, HEAD = 198_272, 2_105_600, 1_048_832


def _fsdp_terms(zero: int) -> tuple[StageMemory, dict[str, tuple[float, str]]]:
    plan = load_plan_text(VOCAB_HEAVY.replace("ZERO", str(zero)), "vocab.plan", strategies=REGISTRY)
    layout = Layout(tp=1, pp=1, dp=8, zero=zero, recompute="none", schedule=None, micro_batch=1)
    (stage,) = estimate_for(plan, layout, REGISTRY)[1].stages
    return stage, {t.name: (t.value, t.phase) for t in (*stage.transient, *stage.act_extra)}


def test_fsdp_head_gradient_and_root_exist_from_the_heads_backward_not_at_the_loss():
    # fp32 (e = g = 4). The head's gradient (ZeRO-3: and the gathered root) from the head's
    # backward to the embedding's (a recomputed block's rerun among them); counted at the loss
    # too, ZeRO-2's peak read +13%.
    after_head = "head backward, recompute, backward, embedding"
    _, terms = _fsdp_terms(2)
    assert terms["FSDP root unit and head gradient (from the head's backward)"] == (4 * HEAD, after_head)
    _, terms = _fsdp_terms(3)
    assert terms["FSDP root unit and head gradient (from the head's backward)"] == (4 * ROOT + 4 * HEAD, after_head)
    # ZeRO-3 gathers the root again at the head's backward: its all-gather output beside its copy,
    # 4 x (root - head) more than the head's gradient after it, beside the logits' gradient 4 x 64 x 8192
    name = "FSDP head backward: the root's all-gather output beside its copy"
    assert terms[name] == (4 * (ROOT - HEAD), "head backward")
    assert terms["the logits' gradient, at the head's backward"] == (4 * 64 * 8192, "head backward")


def test_fsdp_forward_start_and_embedding_moments_without_activations():
    stage, terms = _fsdp_terms(2)
    gone = stage.act_per_layer * 2  # the micro-batch's activations on the 2 blocks
    # ZeRO-2: the root's all-gather output 4 x ROOT and the first block's 4 x BLOCK, less the
    # second block, counted gathered in the states but not gathered yet
    start = "FSDP forward start: the root's all-gather output kept to the first block's"
    assert terms[start] == (4 * ROOT + 4 * BLOCK - 4 * BLOCK - gone, "forward start")
    # the embedding's gradient (token rows and positions, 4 x 1,056,768), the last block's
    # reduce-scatter input 4 x BLOCK, both blocks resharded (4 x 2 x BLOCK fewer than the states)
    embedding = "embedding gradient, beyond the finished activations"
    assert terms[embedding] == (4 * 1_056_768 + 4 * BLOCK - 8 * BLOCK - gone, "embedding")
    # the root's reduce-scatter: its gradients and their copy, 8 x ROOT, the root and the blocks
    # resharded first (4 x ROOT + 8 x BLOCK)
    scatter = "FSDP root unit's reduce-scatter: its gradients and their copy"
    assert terms[scatter] == (8 * ROOT - 4 * ROOT - 8 * BLOCK - gone, "root reduce-scatter")
    assert stage.peak_phase == "forward start"


def _tp2_pp2_last_stage(zero: int, schedule: str) -> tuple[StageMemory, dict[str, Term]]:
    text = VOCAB_HEAVY.replace("ZERO", str(zero)).replace("layers = 2", "layers = 4")
    text = text.replace("tp = 1  pp = 1  dp = 8", f"tp = 2  pp = 2  dp = 2  schedule = {schedule}")
    plan = load_plan_text(text, "vocab-3d.plan", strategies=REGISTRY)
    layout = Layout(tp=2, pp=2, dp=2, zero=zero, recompute="none", schedule=schedule, micro_batch=1)
    stages = estimate_for(plan, layout, REGISTRY)[1].stages
    last = next(s for s in stages if s.rank == 1)
    return last, {t.name: t for t in last.transient}


def test_zero3_gpipe_keeps_the_blocks_gathered_at_a_later_loss():
    # PipelineStage keeps each unit gathered after a backward and only a forward reshards a block:
    # under GPipe no forward follows the first backward, so a later micro-batch's loss holds the
    # last stage's 2 blocks gathered. A block at TP 2 holds 99,520 parameters (two layernorms 512;
    # wq, wk, wv 3 x (128 x 64 + 64); wo 64 x 128 + 128; w1 128 x 256 + 256; w2 256 x 128 + 128).
    name = "blocks' parameters still gathered at a later micro-batch's loss"
    last, terms = _tp2_pp2_last_stage(3, "gpipe")
    term = terms[name]
    assert term == Term(name, 4 * 2 * 99_520, "loss", FROM_FIRST_BACKWARD)
    # the peak is that later loss (simulated, docs/verify.md), the blocks counted there
    assert last.peak_phase == "loss" and last.grads_at_peak == last.grads_after_backward and last.at_peak(term)
    # 1F1B reshards each block in the forward between; ZeRO-2 counts them in its states
    assert name not in _tp2_pp2_last_stage(3, "1f1b")[1]
    assert name not in _tp2_pp2_last_stage(2, "gpipe")[1]
