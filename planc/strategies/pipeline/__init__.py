"""``pipeline``: pipeline parallelism with ``torch.distributed.pipelining``.

The model is split by hand into ``pp x virtual_stages`` chunks of consecutive transformer blocks
(the token and position embeddings join the first chunk; the final norm, the output projection
and the loss the last). Every chunk is the full model with the other blocks deleted, so each
parameter keeps its fully-qualified name (checkpoints and initialisation do not depend on the
split). Each local chunk becomes a ``PipelineStage``; the schedule runs the data-parallel rank's
micro-batches through them:

* ``gpipe`` -- ``ScheduleGPipe``: all forwards, then all backwards (Huang et al. 2019);
* ``1f1b`` -- ``Schedule1F1B``: one forward, one backward (Narayanan et al. 2021, PipeDream-Flush);
* ``interleaved`` -- ``ScheduleInterleaved1F1B`` with ``virtual_stages`` chunks per rank in
  looped order: rank r holds stages r, r + pp, r + 2pp, ... (Narayanan et al. 2021, §2.2);
* ``zero-bubble`` -- ``ScheduleInterleavedZeroBubble`` (looped, any virtual_stages), or
  ``ScheduleZBVZeroBubble`` (two chunks per rank in a V: r and 2pp-1-r) with
  ``zero_bubble = "zbv"``: backward split into input- and weight-gradient halves (Qi et al. 2023).

Gradients are averaged over micro-batches by the schedule (``scale_grads``), then over
data-parallel ranks by DDP/FSDP, so they equal the single-process mean over the global batch.
A model with tied embeddings keeps a copy of the embedding on the last stage; the two copies'
gradients are all-reduced after backward (Megatron's scheme), so they stay identical.
"""

from __future__ import annotations

from typing import Literal

from planc.cost.builtin import pipeline as cost  # noqa: F401  (the plan-time cost pass)
from planc.strategies.composition import StrategyOptions, after

NAME = "pipeline"
API_VERSION = 1
DESCRIPTION = "Pipeline parallelism: torch.distributed.pipelining stages; GPipe, 1F1B, interleaved, zero-bubble"
AFTER = after(NAME)


class Options(StrategyOptions):
    """Options of ``use pipeline { ... }``."""

    zero_bubble: Literal["interleaved", "zbv"] = "interleaved"
    """Which zero-bubble schedule ``schedule = zero-bubble`` runs: ScheduleInterleavedZeroBubble
    (looped stages) or ScheduleZBVZeroBubble (V-shaped, needs virtual_stages = 2)."""


def enabled(plan, layout) -> bool:
    """More than one pipeline stage."""
    return layout.pp > 1


def layer_ranges(layers: int, chunks: int) -> list[range]:
    """Consecutive blocks of each chunk, as even as possible; earlier chunks take the remainder.

    The last chunk also runs the output projection and the loss, so the extra blocks of an uneven
    split go to the front (10 layers in 4 chunks: 3, 3, 2, 2).
    """
    if not 1 <= chunks <= layers:
        raise ValueError(f"cannot split {layers} layers into {chunks} pipeline chunks")
    base, extra = divmod(layers, chunks)
    ranges, start = [], 0
    for chunk in range(chunks):
        size = base + (1 if chunk < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def stage_indices(pp_rank: int, pp: int, virtual_stages: int, style: str) -> list[int]:
    """The pipeline stages rank ``pp_rank`` holds: looped (r, r+pp, ...) or V-shaped (r, 2pp-1-r)."""
    if style == "v":
        return [pp_rank, 2 * pp - 1 - pp_rank]
    return [pp_rank + k * pp for k in range(virtual_stages)]


def assignment_style(layout, options: Options) -> str:
    return "v" if layout.schedule == "zero-bubble" and options.zero_bubble == "zbv" else "loop"


def microbatches(plan, layout) -> int:
    """Micro-batches per optimizer step on one data-parallel rank (the schedule's n_microbatches)."""
    return layout.grad_accumulation(plan.train.global_batch)


def check(plan, layout, options: Options) -> str | None:
    chunks = layout.pp * layout.virtual_stages
    if chunks > plan.model.layers:
        return (
            f"pp x virtual_stages = {chunks} chunks, but the model has only {plan.model.layers} layers; "
            "each chunk needs at least one"
        )
    n_micro = microbatches(plan, layout)
    if layout.schedule in ("gpipe", "1f1b") and layout.virtual_stages != 1:
        return f"the {layout.schedule} schedule runs one stage per rank; set virtual_stages = 1 or use interleaved"
    if layout.schedule == "1f1b" and n_micro < layout.pp:
        return (
            f"1F1B needs at least as many micro-batches as stages: {n_micro} < pp = {layout.pp}; "
            "lower micro_batch or raise global_batch"
        )
    if layout.schedule in ("interleaved", "zero-bubble") and assignment_style(layout, options) == "loop":
        rounds = max(1, n_micro // layout.pp)
        if n_micro % rounds:
            return (
                f"the interleaved schedules run micro-batches in rounds of pp = {layout.pp}; "
                f"{n_micro} micro-batches do not split into {rounds} equal rounds -- use a multiple of {layout.pp}"
            )
    if assignment_style(layout, options) == "v":
        if layout.virtual_stages != 2:
            return "zero_bubble = zbv places two chunks per rank in a V; set virtual_stages = 2"
        if plan.model.tie_embeddings:
            return (
                "ZBV puts the first and the last stage on the same rank, where planc cannot keep a tied copy "
                "of the embedding; use zero_bubble = interleaved, or untie the embeddings"
            )
    if layout.schedule == "zero-bubble" and layout.dp > 1 and layout.zero != 2:
        return ZERO_BUBBLE_DATA_PARALLEL
    return None


#: Measured on torch 2.13 (tests/distributed): with DDP or ZeRO-1 the losses leave the single-process
#: reference at step 2 (|dloss| 0.04), with ZeRO-3 too (0.016); ZeRO-2 matches it to 5e-7.
ZERO_BUBBLE_DATA_PARALLEL = (
    "the zero-bubble schedules compute weight gradients in a separate pass with torch.autograd.grad, which "
    "DistributedDataParallel never sees and which FSDP only handles when parameters stay gathered; "
    "with data parallelism use zero = 2, or the interleaved schedule"
)


def apply(job, options: Options) -> None:
    """Split the model into this rank's chunks; the schedule is built once the chunks are final."""
    from planc.strategies.pipeline.runtime import build_schedule, split_model

    split_model(job, options)
    job.schedule_builder = lambda job: build_schedule(job, options)
