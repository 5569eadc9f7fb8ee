"""Autocast's bf16 weight copies (fp32 parameters under ``torch.autocast``: ZeRO-1, DDP over
autocast, no data parallelism): how long torch keeps them, and the peak ``planc verify --simulate``
measures against the cost model's :func:`planc.strategies.bf16.cost_pass.autocast_copy_terms`.

Counting 2 bytes per parameter once, whatever the recomputation and the schedule, over-predicted
the peak of full and selective recomputation (+7.4% and +6.8% on the plan below; +6.8% and +6.3%
measured on an H100, docs/gpu.md) and under-predicted GPipe's copies, one per micro-batch.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from planc.cost.driver import evaluate
from planc.dsl.load import load_plan_text
from planc.runtime.job import _autocast_forward
from planc.spec import Layout
from planc.strategies.registry import load_registry
from planc.verify.simulate import default_ranks, simulate

REGISTRY = load_registry()

PLAN = """
model "tiny" {{
  layers = 4
  hidden = 256
  heads = 4
  vocab = 8192
  seq_len = 512
  mlp = swiglu
  ffn = 1024
  norm = rmsnorm
  position = rope
}}
hardware {{ device = "cpu"  nodes = 1  per_node = 2 }}
train {{ global_batch = {batch}  micro_batch = 1  precision = bf16  optimizer = adamw  steps = 10 }}
layout {{ {layout} }}
"""

# One block's linears by hand: wq, wk, wv, wo 256 x 256 and the SwiGLU's three 256 x 1024, no
# biases: 4 x 65,536 + 3 x 262,144 = 1,048,576 weights, 2 MiB as bf16 copies. The head: 8192 x 256.
BLOCK_COPY = 2 * 1_048_576
HEAD_COPY = 2 * 8192 * 256


@pytest.fixture(autouse=True)
def no_process_group():
    if dist.is_initialized():
        dist.destroy_process_group()


def _saved_bf16_weights(module: nn.Module, forwards: int, checkpointed: bool) -> int:
    """Distinct storages of bf16 [256, 1024]-element weight copies saved for backward over ``forwards``
    micro-batches through planc's autocast wrapper (each call of the forward is one micro-batch)."""
    _autocast_forward(module, "cpu", torch.bfloat16)
    storages = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dtype == torch.bfloat16 and t.numel() == 256 * 1024:
            storages.add(t.untyped_storage().data_ptr())
        return t

    outputs = []
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for _ in range(forwards):
            x = torch.randn(4, 256, requires_grad=True)
            outputs.append(checkpoint(module, x, use_reentrant=False) if checkpointed else module(x))
    return len(storages)


def test_each_micro_batch_in_flight_keeps_its_own_copies_and_a_checkpointed_block_none():
    # The autocast cache dies with each forward's autocast region, so three micro-batches whose
    # backward has not run hold three copies of each linear's weight (each saves its weight to
    # compute its input's gradient); checkpointing saves no copy.
    model = nn.Sequential(nn.Linear(256, 1024), nn.Linear(1024, 256))
    assert _saved_bf16_weights(model, 3, checkpointed=False) == 2 * 3
    model = nn.Sequential(nn.Linear(256, 1024), nn.Linear(1024, 256))
    assert _saved_bf16_weights(model, 3, checkpointed=True) == 0


@pytest.mark.parametrize("recompute", ["none", "full", "selective"])
def test_the_simulated_zero1_peak_matches_the_copies_autocast_keeps(recompute):
    plan = load_plan_text(
        PLAN.format(batch=4, layout=f"tp = 1  pp = 1  dp = 2  zero = 1  recompute = {recompute}"),
        "autocast.plan",
        strategies=REGISTRY,
    )
    layout = Layout(tp=1, pp=1, dp=2, zero=1, recompute=recompute, schedule=None, micro_batch=1)
    result = simulate(plan, layout, REGISTRY, default_ranks(layout))
    peaks = [r for r in result["rows"] if r["section"] == "peak memory"]
    assert peaks and all(abs(r["error"]) < 0.03 for r in peaks), peaks


def _copy_terms(layout_text: str, layout: Layout, batch: int) -> dict[int, dict[str, tuple[float, str]]]:
    plan = load_plan_text(PLAN.format(batch=batch, layout=layout_text), "autocast.plan", strategies=REGISTRY)
    est = evaluate(plan, layout, REGISTRY.passes(plan, layout))
    return {
        s.rank: {
            t.name: (t.value, t.phase)
            for t in s.transient
            if "autocast" in t.name or t.name.startswith("output head's backward")
        }
        for s in est.stages
    }


def test_gpipe_keeps_a_copy_per_micro_batch_in_flight():
    # Two stages of two blocks; GPipe runs all 8 forwards before any backward: stage 0 holds
    # 8 x 2 block-micro-batches of copies, the last stage its blocks' and 8 of the head's (and, in
    # the head's backward, the weight's bf16 gradient beside them and the logits' gradient, the
    # base estimate's term).
    layout = Layout(tp=1, pp=2, dp=1, zero=0, recompute="none", schedule="gpipe", micro_batch=1)
    terms = _copy_terms("tp = 1  pp = 2  dp = 1  recompute = none  schedule = gpipe", layout, batch=8)
    assert sorted(terms[0].values()) == [(16 * BLOCK_COPY, "")]
    assert sorted(terms[1].values()) == sorted(
        [
            (16 * BLOCK_COPY, ""),
            (8 * HEAD_COPY, "loss"),
            (8 * HEAD_COPY, "forward"),
            (9 * HEAD_COPY, "head backward"),
        ]
    )


def test_under_recompute_copies_live_in_the_forward_the_recomputed_block_and_the_head():
    # The cache holds the stage's two blocks' copies until its forward ends, one block's exist again
    # from its rerun's end through its backward, the head keeps its copy to its backward; the embedding casts nothing.
    # The last stage's forward ends with the logits (512 tokens x 8192, bf16) beside them all and
    # the head's copy, and its head's backward holds the logits' gradient (the base estimate's
    # term), the copy and the weight's bf16 gradient.
    layout = Layout(tp=1, pp=2, dp=1, zero=0, recompute="full", schedule="1f1b", micro_batch=1)
    terms = _copy_terms("tp = 1  pp = 2  dp = 1  recompute = full  schedule = 1f1b", layout, batch=8)
    rerun = "recompute, backward"
    assert sorted(terms[0].values()) == [(BLOCK_COPY, rerun), (2 * BLOCK_COPY, "forward")]
    assert sorted(terms[1].values()) == sorted(
        [
            (BLOCK_COPY, rerun),
            (HEAD_COPY, "loss"),
            (2 * BLOCK_COPY + HEAD_COPY, "forward"),  # beside the logits, the base estimate's term
            (2 * HEAD_COPY, "head backward"),
        ]
    )


GPU_PLAN = Path(__file__).resolve().parents[2] / "plans" / "gpu" / "llama3-8b-4layers-1xh100.plan"


@pytest.mark.parametrize("change", ["", "recompute = full", "recompute = selective", "micro_batch = 2"])
def test_the_h100_plan_simulated_within_2_percent(change, tmp_path):
    """The plan measured on an H100 (docs/gpu.md, third session: the GPU's peaks were 0.8-1.1% above
    the model's, 40.9, 34.1 and 49.5 GiB for none, full and micro-batch 2), simulated here: its
    128 K vocabulary runs the loss in several chunks, and the peak sits in the forward's end, the
    loss or the head's backward by the variant. Before the copies were counted by phase the model
    was 6-7% above the GPU under recomputation."""
    text = GPU_PLAN.read_text()
    if change:
        key = change.split(" = ")[0]
        text = re.sub(rf"(?m)^(\s*{key}\s*=\s*)\S+", lambda m: m.group(1) + change.split(" = ")[1], text)
    plan = load_plan_text(text, "gpu.plan", strategies=REGISTRY)
    lay = plan.layout
    layout = Layout(
        tp=1, pp=1, dp=1, zero=0, recompute=lay.recompute, schedule=None, micro_batch=plan.train.micro_batch
    )
    result = simulate(plan, layout, REGISTRY, [0])
    (peak,) = [r for r in result["rows"] if r["section"] == "peak memory"]
    assert abs(peak["error"]) < 0.02, peak


def _two_stage_peaks(schedule: str, v: int = 1, zbv: bool = False, micro_batches: int = 4) -> list[dict]:
    """The simulated peak rows of the plan on two pipeline ranks of ``schedule``, ``v`` stages each
    (ZB-V's V-shaped placement with ``zbv``)."""
    text = GPU_PLAN.read_text().replace("per_node = 1", "per_node = 2")
    text = re.sub(r"(?m)^(\s*global_batch\s*=\s*)4", rf"\g<1>{micro_batches}", text)
    text = re.sub(r"(?m)^(\s*pp\s*=\s*)1", r"\g<1>2", text)
    text = text.replace("recompute = none", f"recompute = none\n  schedule = {schedule}\n  virtual_stages = {v}")
    if zbv:
        text += '\nuse pipeline { zero_bubble = "zbv" }\n'
    plan = load_plan_text(text, f"gpu-{schedule}.plan", strategies=REGISTRY)
    layout = Layout(tp=1, pp=2, dp=1, zero=0, recompute="none", schedule=schedule, micro_batch=1, virtual_stages=v)
    result = simulate(plan, layout, REGISTRY, [0, 1])
    return [r for r in result["rows"] if r["section"] == "peak memory"]


def test_a_1f1b_pipeline_of_the_h100_plan_simulated_within_2_percent():
    """The same plan on two 1F1B stages: the last stage's peak is the head's forward from the second
    micro-batch on, where torch's schedule loop still holds the previous micro-batch's logits
    (``output = stage.forward_one_chunk(...)``) -- 1.96 GiB more than the model had (-5.4%)."""
    peaks = _two_stage_peaks("1f1b")
    assert len(peaks) == 2 and all(abs(r["error"]) < 0.02 for r in peaks), peaks


def test_a_1f1b_first_stage_holds_a_gradient_buffer_per_micro_batch():
    """torch's stage allocates a gradient receive buffer for every micro-batch at its first step and
    keeps them; nothing the tracker sees returns them (the schedule hands them to autograd as they
    are), so the simulation is told of them. Untold, the first stage read 2 GiB low at 16
    micro-batches (+8% against the model, +14.6% at 32). The first stage also holds each
    micro-batch's output in flight and peaks in a block's backward: with neither counted the model
    was 0.65 GiB (2.8%) under the simulation at 4 and 32 micro-batches."""
    peaks = _two_stage_peaks("1f1b", micro_batches=16)
    assert len(peaks) == 2 and all(abs(r["error"]) < 0.02 for r in peaks), peaks


def test_a_gpipe_pipeline_of_the_h100_plan_simulated_within_1_percent():
    """The same plan on two GPipe stages: every forward runs before any backward, so the
    activations peak while the gradients (set to None at the step's start) do not exist yet.
    Counting them throughout had the stages at +10.9% and +5.5%. The last stage's four waiting
    micro-batches each keep the final norm's and head's inputs too (0.19 GiB each): -2.2% without."""
    peaks = _two_stage_peaks("gpipe")
    assert len(peaks) == 2 and all(abs(r["error"]) < 0.01 for r in peaks), peaks


def test_the_h100_plan_with_one_micro_batch_per_step_simulated_within_2_percent():
    """One micro-batch per step: the step's only forward and the head's backward come before any
    gradient exists (7.16 GiB of fp32 gradients for this plan). Counted throughout: +20.5%."""
    text = re.sub(r"(?m)^(\s*global_batch\s*=\s*)4", r"\g<1>1", GPU_PLAN.read_text())
    plan = load_plan_text(text, "gpu-m1.plan", strategies=REGISTRY)
    layout = Layout(tp=1, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=1)
    result = simulate(plan, layout, REGISTRY, [0])
    (peak,) = [r for r in result["rows"] if r["section"] == "peak memory"]
    assert abs(peak["error"]) < 0.02, peak


def test_the_simulated_optimizer_is_the_gpu_programs_fused_one():
    """With one micro-batch and full recomputation the step's activations are small, and torch's
    CPU loop AdamW, which holds two temporaries the size of the parameter it updates (3.9 GiB for
    the embedding), made the optimizer step the simulated peak: -6.5% against the model of the
    CUDA program, whose fused AdamW holds none. Simulated with the fused kernel, the peak is the
    end of the backward: the last block's recompute working set beside every gradient but the
    embedding's, whose backward comes last (+6.5% while the model put it there too)."""
    text = re.sub(r"(?m)^(\s*global_batch\s*=\s*)4", r"\g<1>1", GPU_PLAN.read_text())
    plan = load_plan_text(text.replace("recompute = none", "recompute = full"), "gpu-m1-full.plan", strategies=REGISTRY)
    layout = Layout(tp=1, pp=1, dp=1, zero=0, recompute="full", schedule=None, micro_batch=1)
    result = simulate(plan, layout, REGISTRY, [0])
    (peak,) = [r for r in result["rows"] if r["section"] == "peak memory"]
    assert abs(peak["error"]) < 0.02, peak


def test_a_zero_bubble_pipeline_of_the_h100_plan_simulated_within_4_percent():
    """The same plan on two zero-bubble stages. The last stage holds the logits of the micro-batches
    in flight (two), not every micro-batch's to the step's end as a recomputed loss would (+13.9%
    when counted so); the first stage's input is token ids, so it has no input pass and keeps no
    output gradients between the halves (+6.2% when counted)."""
    peaks = _two_stage_peaks("zero-bubble")
    assert len(peaks) == 2 and all(abs(r["error"]) < 0.04 for r in peaks), peaks


@pytest.mark.parametrize("zbv", [False, True], ids=["looped", "v"])
def test_zero_bubble_with_two_stages_per_rank_simulated_within_4_percent(zbv):
    """v = 2: the looped schedule's last rank holds two micro-batches' logits, as with v = 1 (the
    model had counted every micro-batch's: +16.7%); ZB-V's first rank, which holds the head stage,
    one (+54.8% when counted as every micro-batch's, with their head weight copies)."""
    peaks = _two_stage_peaks("zero-bubble", v=2, zbv=zbv)
    assert len(peaks) == 2 and all(abs(r["error"]) < 0.04 for r in peaks), peaks


def test_zero_bubble_keeps_each_micro_batchs_input_gradient_on_the_last_stage():
    """torch's input pass stores each stage input's gradient on the input, the micro-batch's receive
    buffer, which lives through the step: with 16 micro-batches the last stage holds 16 of them
    (-7.2% without them). The first stage has none to keep (its input is token ids)."""
    peaks = _two_stage_peaks("zero-bubble", micro_batches=16)
    last = next(r for r in peaks if r["rank"] == 1)
    assert abs(last["error"]) < 0.03, last


def test_interleaved_sends_hold_their_tensors_until_the_steps_end():
    """torch's interleaved schedule waits on its sends only at the step's end, and each send's work
    holds its tensor until then: every stage output past its backward and every input gradient
    past its send. The simulation holds them as a real process group does
    (``fake_pipeline.sends_hold_their_tensors``); on 2 CPU processes over gloo (tiny model, 16
    micro-batches) the model without them read -13.8% and -16.4% against the real run, and the
    simulation without them matched that wrong model."""
    peaks = _two_stage_peaks("interleaved", v=2, micro_batches=16)
    assert len(peaks) == 2 and all(abs(r["error"]) < 0.02 for r in peaks), peaks


@pytest.mark.xfail(
    strict=True,
    reason="zero-bubble's sends held until the step's end are not priced yet: -3.3% and -6.5% "
    "(the simulation holds them since it holds a real process group's sends)",
)
def test_zbv_keeps_one_input_gradient_per_micro_batch_on_each_rank():
    """ZB-V on two ranks, 16 micro-batches: each rank receives one stage's input over the network
    (the head stage on rank 0, stage 1 on rank 1) and keeps its gradient on it; the turn of the V
    (stages 1 and 2 on rank 1) hands its tensors over on the rank, as receive buffers. Without the
    input gradients the ranks read -4.3% and -6.3%, growing with the micro-batch count."""
    peaks = _two_stage_peaks("zero-bubble", v=2, zbv=True, micro_batches=16)
    assert len(peaks) == 2 and all(abs(r["error"]) < 0.02 for r in peaks), peaks
