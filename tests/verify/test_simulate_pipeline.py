"""``planc verify --simulate`` on pipelined layouts: each stage of a tiny model, one rank at a time
in this process, with :mod:`planc.verify.fake_pipeline` answering for the other stages (and, on
the same tiny model with a large vocabulary, DistributedDataParallel over tensor parallelism).

Model-state bytes per stage are derived by hand from the shapes; peaks are held to the cost
model's within the same loose bound as the unpipelined test (tests/verify/test_simulate.py): it
catches a whole category missed or kept twice, not the last percent (bench/simulate_matrix.py
holds Llama 3 plans to the 15% goal).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from planc.cli import main
from planc.dsl.load import load_plan_text
from planc.spec import Layout
from planc.strategies.registry import load_registry
from planc.verify.fake_pipeline import PeerRuleBroken, _checker, boundary_meta
from planc.verify.simulate import default_ranks, refusal, simulate

REGISTRY = load_registry()


@pytest.fixture(autouse=True)
def no_process_group():
    if dist.is_initialized():
        dist.destroy_process_group()


PLAN = """
model "tiny" {{
  layers = {layers}
  hidden = 128
  heads = 4
  vocab = {vocab}
  seq_len = {seq_len}
  mlp = gelu
  norm = layernorm
  position = learned
}}
hardware {{ device = "cpu"  nodes = {nodes}  per_node = 4 }}
train {{ global_batch = {batch}  micro_batch = 1  precision = {precision}  optimizer = adamw  steps = 10 }}
layout {{ {layout} }}
"""


def _plan(
    layout: str,
    *,
    layers: int = 2,
    vocab: int = 256,
    nodes: int = 4,
    batch: int = 32,
    precision: str = "fp32",
    seq_len: int = 64,
    hidden: int = 128,
    extra: str = "",
):
    text = PLAN.format(
        layers=layers, vocab=vocab, nodes=nodes, batch=batch, precision=precision, layout=layout, seq_len=seq_len
    ).replace("hidden = 128", f"hidden = {hidden}")
    text += extra
    return load_plan_text(text, "pp.plan", strategies=REGISTRY)


# Parameters of the plan's model (vocab 256), by hand: a block is 198,272 (two layernorms 512;
# wq, wk, wv, wo with bias 4 x 16,512; w1 66,048; w2 65,664 -- as tests/verify/test_simulate.py).
# Stage 0: block 0 + token embedding 256 x 128 + positions 64 x 128 = 239,232.
# Stage 1: block 1 + final norm 256 + head 256 x 128 = 231,296.
# ZeRO-3 over dp 8 shards every parameter's dim 0 (64 ... 512, all multiples of 8): / 8 exactly.
STAGE_PARAMS = {0: 239_232 // 8, 1: 231_296 // 8}


def test_each_stage_of_a_zero3_pipeline_holds_its_own_shards_and_a_peak_near_the_prediction():
    plan = _plan("tp = 1  pp = 2  dp = 8  zero = 3  schedule = 1f1b  recompute = none")
    layout = Layout(tp=1, pp=2, dp=8, zero=3, recompute="none", schedule="1f1b", micro_batch=1)
    assert refusal(plan, layout, REGISTRY) is None
    result = simulate(plan, layout, REGISTRY, default_ranks(layout))
    assert [r["rank"] for r in result["ranks"]] == [0, 8]  # dp rank 0 of the first and the last stage
    for record in result["ranks"]:
        n = STAGE_PARAMS[record["coordinates"]["pp"]]
        assert record["model_states"] == {"params": 4 * n, "grads": 4 * n, "optimizer": 8 * n}
    peaks = [r for r in result["rows"] if r["section"] == "peak memory"]
    assert len(peaks) == 2 and all(abs(r["error"]) < 0.25 for r in peaks), peaks


def test_the_last_stage_keeps_no_micro_batch_logits():
    # 8 micro-batches per pipeline of logits [1, 64, 4096] in fp32: 1 MiB each. The schedule's
    # default (return_outputs=True) would keep all 8 (8 MiB) for the step's return value, beside a
    # last-stage peak the cost model puts near 18 MiB: the simulated peak stays near the prediction
    # only because planc's step asks for no outputs.
    plan = _plan("tp = 1  pp = 2  dp = 2  zero = 2  schedule = 1f1b  recompute = none", vocab=4096, nodes=1, batch=16)
    layout = Layout(tp=1, pp=2, dp=2, zero=2, recompute="none", schedule="1f1b", micro_batch=1)
    result = simulate(plan, layout, REGISTRY, [2])  # pp rank 1, dp rank 0
    (peak,) = [r for r in result["rows"] if r["section"] == "peak memory"]
    kept_logits = 8 * 64 * 4096 * 4
    assert kept_logits > 0.3 * peak["predicted"]
    assert abs(peak["error"]) < 0.15, peak


@pytest.mark.parametrize(
    "schedule",
    [
        "interleaved",  # two stages on each rank
        "zero-bubble",  # split backward: autograd.grad on the inputs, later on the weights
    ],
)
def test_multi_stage_schedules_simulate_every_local_stage(schedule):
    text = f"tp = 1  pp = 2  dp = 8  zero = 2  schedule = {schedule}  virtual_stages = 2"
    plan = _plan(text, layers=4, precision="bf16")
    layout = Layout(tp=1, pp=2, dp=8, zero=2, recompute="none", schedule=schedule, virtual_stages=2, micro_batch=1)
    assert refusal(plan, layout, REGISTRY) is None
    result = simulate(plan, layout, REGISTRY, [0])
    states = [r for r in result["rows"] if r["section"] == "model states"]
    assert states and all(r["error"] == pytest.approx(0, abs=0.01) for r in states), states
    (peak,) = [r for r in result["rows"] if r["section"] == "peak memory"]
    assert abs(peak["error"]) < 0.25, peak


def test_zero_bubble_peaks_do_not_grow_with_the_micro_batches():
    # With the tracker's module hooks, the split backward's never-fired hooks held every micro-batch's
    # graph: the peak grew 26 -> 31 MiB from 4 to 16 micro-batches (8 layers), which a real run does
    # not (docs/verify.md). Per micro-batch a stage holds its recv buffers (16 KiB here) and nothing
    # else that lasts the step: 8 more micro-batches may add well under 10%.
    peaks = []
    for batch in (8, 24):
        text = "tp = 1  pp = 2  dp = 2  zero = 2  schedule = zero-bubble  virtual_stages = 2  recompute = none"
        plan = _plan(text, layers=4, vocab=8192, nodes=1, batch=batch, precision="bf16")
        layout = Layout(
            tp=1, pp=2, dp=2, zero=2, recompute="none", schedule="zero-bubble", virtual_stages=2, micro_batch=1
        )
        (peak,) = [r for r in simulate(plan, layout, REGISTRY, [0])["rows"] if r["section"] == "peak memory"]
        peaks.append(peak["measured"])
    assert peaks[1] < 1.1 * peaks[0], peaks


def test_a_message_the_stand_in_would_not_have_sent_stops_the_simulation():
    class Stage:
        stage_index = 1

    forward = object()
    send = _checker(Stage(), forward, object())
    send(forward, 2)  # what the other stages were told: fine
    with pytest.raises(PeerRuleBroken, match="stage 1 sends stage 2"):
        send("another shape", 2)


def test_the_boundary_is_the_hidden_state_in_the_residual_streams_dtype():
    class Job:
        pass

    job = Job()
    job.layout = Layout(
        tp=4, pp=2, dp=2, zero=3, recompute="none", schedule="1f1b", micro_batch=2, sequence_parallel=True
    )
    job.plan = _plan("tp = 4  pp = 2  dp = 2  zero = 3  schedule = 1f1b")
    job.mixed_precision = None
    meta = boundary_meta(job)
    assert tuple(meta.shape) == (2, 64 // 4, 128) and meta.dtype == torch.float32 and meta.requires_grad


def test_the_command_simulates_a_pipelined_plan(tmp_path, capsys):
    path = tmp_path / "pp.plan"
    path.write_text(
        PLAN.format(
            layers=2,
            vocab=256,
            nodes=4,
            batch=32,
            precision="fp32",
            seq_len=64,
            layout="tp = 1  pp = 2  dp = 8  zero = 3",
        )
    )
    assert main(["verify", str(path), "--simulate", "--ranks", "8", "--out", str(tmp_path / "run")]) == 0
    assert "rank 8" in capsys.readouterr().out


def test_the_first_stage_under_tp_holds_the_embedding_gradient_over_the_whole_vocabulary():
    # DTensor has no row-sharded strategy for the embedding's backward: under FSDP its gradient over
    # all 8192 rows exists, in bf16 and in fp32, at the end of each micro-batch's backward while the
    # other micro-batch in flight keeps its activations: (2 + 4) x 4096 x 128 = 3 MiB beyond this
    # rank's rows, 16% of this stage's peak, which the cost model missed before
    plan = _plan(
        "tp = 2  pp = 2  dp = 2  zero = 2  schedule = 1f1b  recompute = none",
        vocab=8192,
        nodes=2,
        batch=16,
        precision="bf16",
    )
    layout = Layout(tp=2, pp=2, dp=2, zero=2, recompute="none", schedule="1f1b", micro_batch=1)
    result = simulate(plan, layout, REGISTRY, [0])
    (peak,) = [r for r in result["rows"] if r["section"] == "peak memory"]
    assert abs(peak["error"]) < 0.05, peak


@pytest.mark.parametrize("schedule, layers, seq_len", [("1f1b", 4, 512), ("gpipe", 8, 256)])
def test_a_deferred_reduction_accumulates_the_embedding_gradient_over_the_whole_vocabulary(schedule, layers, seq_len):
    # Under pipelining FSDP2 reduces once per step and accumulates the gradients unsharded in fp32
    # meanwhile -- the embedding's over all 8192 rows, as DTensor's backward makes it: 4 x 4096 x
    # 128 = 2 MiB beyond this rank's rows, 11% of this stage's peak. Under 1F1B a forward follows
    # each backward, so the activations are back at their most with it held (priced only at the
    # embedding's backward, less the activations it freed, the peak read -4.5%); under GPipe every
    # forward comes first and it exists only from the first embedding backward on (counted
    # throughout, +5.5%). Enough layers here that one micro-batch's activations on the stage
    # outweigh the whole gradient.
    plan = _plan(
        f"tp = 2  pp = 2  dp = 2  zero = 2  schedule = {schedule}  recompute = none",
        layers=layers,
        vocab=8192,
        nodes=2,
        batch=16,
        precision="bf16",
        seq_len=seq_len,
    )
    layout = Layout(tp=2, pp=2, dp=2, zero=2, recompute="none", schedule=schedule, micro_batch=1)
    result = simulate(plan, layout, REGISTRY, [0])
    (peak,) = [r for r in result["rows"] if r["section"] == "peak memory"]
    assert abs(peak["error"]) < 0.03, peak


def test_under_ddp_over_tp_the_embedding_gradient_and_its_local_rows_are_priced():
    # DistributedDataParallel over tensor-parallel shards (ZeRO-1 here; fp32 DDP alike): at the end of
    # backward the embedding's gradient exists over all 8192 rows and again as this rank's 4096,
    # before the reducer copies them into its bucket -- 4 + 2 MiB in fp32, a third of this peak, which
    # the cost model missed (-12% and -15% on the two ZeRO-1 ranks before). bf16 runs the same fp32
    # embedding under autocast, whose bf16 weight copies are gone by then.
    for precision in ("fp32", "bf16"):
        plan = _plan(
            "tp = 2  pp = 1  dp = 4  zero = 1  recompute = none", vocab=8192, nodes=2, batch=16, precision=precision
        )
        layout = Layout(tp=2, pp=1, dp=4, zero=1, recompute="none", schedule=None, micro_batch=1)
        result = simulate(plan, layout, REGISTRY, default_ranks(layout))
        peaks = [r for r in result["rows"] if r["section"] == "peak memory"]
        assert len(peaks) == 2 and all(abs(r["error"]) < 0.05 for r in peaks), (precision, peaks)


def test_a_zero_bubble_middle_stage_holds_its_other_stages_weight_pass_gradients():
    # FSDP2's post-backward hook fires in the input pass, so a stage's weight pass leaves its
    # gradients in the unsharded parameters' .grad, in bf16, until that stage's next input pass.
    # PP 4 x DP 2, v = 2, one block per stage, 8 micro-batches (two rounds): at the middle rank's
    # peak (stages 1 and 5, in stage 5's input pass) stage 1 has run a weight pass since its last
    # input pass (torch's order: ... 1W3 5F6 5I4 ... 1I4), so its block's gradients wait beside
    # the running block's. Blocks of hidden 512 hold 3,152,384 parameters (two layernorms 2,048;
    # wq, wk, wv, wo with bias 4 x 262,656; w1 1,050,624; w2 1,049,088): 2 x 3,152,384 B = 6.0 MiB
    # waiting, 6.3% of the 96 MiB peak, which the cost model missed (-5.2%). What is left is
    # the other terms' (+1.0%): 2.5% holds it with the missing block well outside.
    plan, layout = _tiny_zero_bubble(micro_batches=8)
    assert refusal(plan, layout, REGISTRY) is None
    result = simulate(plan, layout, REGISTRY, [2])  # pipeline rank 1, data-parallel rank 0
    (peak,) = [r for r in result["rows"] if r["section"] == "peak memory"]
    assert abs(peak["error"]) < 0.025, peak


def test_the_last_zero_bubble_rank_with_two_rounds_peaks_in_its_last_stages_weight_pass():
    # The plan above at the last rank (stages 3 and 7). With 8 micro-batches (two rounds) each of
    # its stages runs a round's input passes before its weight passes (torch's order: ... 3I3 3W0
    # ... 7F7 7I7 7W4 3I4 7W5 ...), and FSDP2 makes a unit's fp32 accumulation in its first input
    # pass after a weight pass: at the activations' peak (7I7, 7W4) stage 3's first gradients wait
    # in bf16 with no fp32 accumulation (2 x 3,152,384 B = 6.0 MiB beside none of its 12.0), and
    # stage 7's were added at 7I4. The peak is 7W5, after 3I4: 7 stage-micro-batches, stage 7's
    # gradients from 7W4 in bf16 (its block and the head's 512 x 512: 6.5 MiB) beside 7W5's
    # running parameter group, the MLP's 2 x (2 x 512 x 2048 + 2048 + 512) B = 4.0 MiB, nothing of
    # stage 3 waiting. The model counted, at 8 held, stage 3's 6.0 MiB as if accumulated and
    # stage 7's own block beside (+5.0%); 2.5% holds the running group's 4 MiB (4.1%) out.
    result = simulate(*_tiny_zero_bubble(micro_batches=8), REGISTRY, [6])  # pipeline rank 3, data-parallel rank 0
    (peak,) = [r for r in result["rows"] if r["section"] == "peak memory"]
    assert abs(peak["error"]) < 0.025, peak


@pytest.mark.parametrize("micro_batches, rank", [(4, 0), (4, 2), (4, 6), (6, 6)])
def test_zero_bubble_ranks_with_one_round_hold_only_the_running_stages_gradients(micro_batches, rank):
    # The plan above with one round of micro-batches (m = p = 4; 6). Each rank runs its stages'
    # weight passes one stage after another, its last stage first; torch reduces a stage right
    # after its last (REDUCE_GRAD: sharded gradients made, the unsharded and the gathered
    # parameters freed), and FSDP2 makes a stage's fp32 accumulation only in an input pass after
    # a weight pass. Rank 0 (stages 0 and 4; torch's order 0F0-0F3 4F0-4F3 4I0 4W0 4I1 4W1 ...)
    # peaks in 4W1: 7 stage-micro-batches, stage 4's accumulation, 4 x 3,152,384 B = 12.0 MiB,
    # and its new gradients; stage 0 has none yet, and no sharded gradient exists. The last rank
    # at m = 4 runs all of stage 7's input passes before its weight passes (7I3 7W0 3I0 7W1):
    # no accumulation at all, 7W0's gradients in bf16 (6.5 MiB with the head) beside 7W1's. The
    # model held every stage's accumulation (24-25 MiB) and the other stage's waiting gradients
    # (6.0 MiB): +20% to +41%; 3% holds one stage's accumulation (15% of the peak) out.
    result = simulate(*_tiny_zero_bubble(micro_batches), REGISTRY, [rank])
    (peak,) = [r for r in result["rows"] if r["section"] == "peak memory"]
    assert abs(peak["error"]) < 0.03, peak


@pytest.mark.parametrize("micro_batches, rank", [(4, 0), (4, 2), (4, 4), (4, 6), (5, 0)])
def test_zbv_with_fewer_micro_batches_than_planned_holds_what_torchs_order_keeps(micro_batches, rank):
    # The plan above under ZB-V (rank r holds stages r and 7 - r), with fewer micro-batches than
    # torch plans the V for (2p - 1 = 7): torch drops the missing ones from its order, and each
    # rank's second stage runs most of its backwards before its first stage's begin. Rank 0
    # (torch's order 0F0-0F3 7F0 7I0 7W0 7F1 7I1 7W1 ... 7I3 7W3 0I0 0W0 ...) peaks in 7I3: 5
    # stage-micro-batches, stage 7's accumulation (its block's 4 x 3,152,384 B = 12.0 MiB and the
    # head's 1.0) with 7W2's gradients in bf16 beside it (6.5 MiB), nothing of stage 0. Rank 2
    # (stages 2 and 5) peaks in 2W1: both stages' accumulations (24.1 MiB), stage 5's 6.0 MiB
    # waiting for 5I3, 4 held -- higher than rank 1, whose stage 6 is reduced before stage 1
    # accumulates. The model held both stages' accumulations and the other stage's waiting
    # gradients at 2p stage-micro-batches less the dropped ones, and priced every middle rank as
    # rank 1: +22.8%, +18.6%, +3.8%, +3.8% at 4 micro-batches, +6.4% on rank 0 at 5; 2% holds the
    # smallest of those out.
    result = simulate(*_tiny_zero_bubble(micro_batches, zbv=True), REGISTRY, [rank])
    (peak,) = [r for r in result["rows"] if r["section"] == "peak memory"]
    assert abs(peak["error"]) < 0.02, peak


@pytest.mark.parametrize(
    "tp, pp, dp, zero", [(1, 1, 8, 2), (1, 1, 8, 3), (2, 1, 4, 2), (2, 1, 4, 3), (2, 2, 2, 2), (2, 2, 2, 3)]
)
def test_fp32_fsdp_on_a_model_whose_vocabulary_outweighs_its_blocks(tp, pp, dp, zero):
    # hidden 128, vocabulary 8192: the embedding and head (2 x 4 MiB in fp32) outweigh the two
    # blocks (0.76 MiB each) and the loss sets the peak's moment. Predicted -15% to +13% before
    # (ZeRO-2 +13%: the head's gradient counted at the loss, the root's all-gather output kept by
    # FSDP2's forward prefetch missed; TP 2 -10% / -14%: loss_parallel's 16 bytes per logit and
    # the embedding gradient's local rows; TP 2 x PP 2 -11% to -14%: the embedding's own rows and
    # the logits the stage keeps through the loss). Each of those terms is 2.2% (the last block's
    # reduce-scatter input, 0.38 of 17.2 MiB) to 47% of its peak; all within 0.2% now: 2% catches
    # any one of them missed again.
    layout_text = f"tp = {tp}  pp = {pp}  dp = {dp}  zero = {zero}  recompute = none"
    schedule = "1f1b" if pp > 1 else None
    plan = _plan(layout_text + ("  schedule = 1f1b" if schedule else ""), vocab=8192, nodes=2, batch=16)
    layout = Layout(tp=tp, pp=pp, dp=dp, zero=zero, recompute="none", schedule=schedule, micro_batch=1)
    result = simulate(plan, layout, REGISTRY, default_ranks(layout))
    peaks = [r for r in result["rows"] if r["section"] == "peak memory"]
    assert len(peaks) == pp and all(abs(r["error"]) < 0.02 for r in peaks), peaks


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_last_gpipe_stage_over_fsdp_peaks_at_the_second_micro_batchs_loss(precision):
    # TP 2 x PP 2 x DP 2, ZeRO-2, GPipe, 8 micro-batches; the last stage holds 2 blocks, the final
    # norm and the head (4096 x 128 rows of the vocabulary's 8192). Its peak is the second
    # micro-batch's loss: the first one's backward has made every gradient, accumulated unsharded
    # in fp32 -- the head's 4096 x 128 x 4 B = 2 MiB and the blocks' 0.76 MiB -- and freed its
    # own activations and loss, so 6 other losses wait beside the running one, not 7. The model
    # counted the gradients at the first micro-batch's loss, beside all 7 (+9% in fp32, +8% in
    # bf16, the gradients' 2.76 MiB of a 31.5 / 24.2 MiB peak less the one micro-batch's 2.7 /
    # 1.8 MiB); without the second micro-batch's loss it would read -0.2% / -3.3%.
    peak = _last_gpipe_stage_peak(zero=2, precision=precision)
    assert abs(peak["error"]) < 0.02, peak


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_last_gpipe_stage_over_zero3_keeps_its_blocks_gathered_at_a_later_loss(precision):
    # The plan above under ZeRO-3. PipelineStage keeps every unit gathered after a backward
    # (set_reshard_after_backward(False)) and only a forward reshards a block; under GPipe none
    # follows, so at the peak, the second micro-batch's loss, both blocks' unsharded parameters
    # are live. A block at TP 2 holds 99,520 parameters (two layernorms 512; wq, wk, wv 3 x
    # (128 x 64 + 64); wo 64 x 128 + 128; w1 128 x 256 + 256; w2 256 x 128 + 128): 2 x 99,520 x 4 B
    # = 0.76 MiB of a 31.5 MiB peak in fp32, 0.38 of 24.2 in bf16. Without them the model read
    # -1.8% / -1.2%; with them it prices what ZeRO-2 holds there (+0.6% / +0.4%). Under-prediction
    # is what runs out of memory: no lower than -0.5%, and within 1%.
    peak = _last_gpipe_stage_peak(zero=3, precision=precision)
    assert -0.005 <= peak["error"] < 0.01, peak


def _tiny_zero_bubble(micro_batches: int, zbv: bool = False) -> tuple:
    """The tiny zero-bubble plan of the tests above and its layout: PP 4 x DP 2, two stages of one
    block (hidden 512) per rank, bf16 over ZeRO-2, ``micro_batches`` of one sequence; looped, or
    ZB-V's V-shaped placement with ``zbv``."""
    plan = _plan(
        "tp = 1  pp = 4  dp = 2  zero = 2  schedule = zero-bubble  virtual_stages = 2  recompute = none",
        layers=8,
        vocab=512,
        nodes=2,
        batch=2 * micro_batches,
        precision="bf16",
        hidden=512,
        extra='use pipeline { zero_bubble = "zbv" }' if zbv else "",
    )
    layout = Layout(tp=1, pp=4, dp=2, zero=2, recompute="none", schedule="zero-bubble", virtual_stages=2, micro_batch=1)
    return plan, layout


def _last_gpipe_stage_peak(*, zero: int, precision: str) -> dict:
    """The simulated peak row of the last stage (pipeline rank 1, data-parallel rank 0: global rank
    4) of the tiny TP 2 x PP 2 x DP 2 GPipe plan over FSDP, 8 micro-batches of one sequence."""
    plan = _plan(
        f"tp = 2  pp = 2  dp = 2  zero = {zero}  schedule = gpipe  recompute = none",
        layers=4,
        vocab=8192,
        nodes=2,
        batch=16,
        precision=precision,
    )
    layout = Layout(tp=2, pp=2, dp=2, zero=zero, recompute="none", schedule="gpipe", micro_batch=1)
    result = simulate(plan, layout, REGISTRY, [4])
    (peak,) = [r for r in result["rows"] if r["section"] == "peak memory"]
    return peak
