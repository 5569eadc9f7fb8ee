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

import functools
from typing import TYPE_CHECKING

from planc import stages
from planc.legality import rules as legality
from planc.stages import StageStyle, ZeroBubbleVariant
from planc.strategies.api import StrategyOptions
from planc.strategies.composition import after
from planc.strategies.pipeline.cost_pass import cost as cost  # the plan-time cost pass (a contract hook)

if TYPE_CHECKING:
    from planc.runtime.job import Job
    from planc.spec.layout import Layout
    from planc.spec.plan import Plan

NAME = "pipeline"
API_VERSION = 1
DESCRIPTION = "Pipeline parallelism: torch.distributed.pipelining stages; GPipe, 1F1B, interleaved, zero-bubble"
AFTER: tuple[str, ...] = after(NAME)


class Options(StrategyOptions):
    """Options of ``use pipeline { ... }``."""

    zero_bubble: ZeroBubbleVariant = "interleaved"
    """Which zero-bubble schedule ``schedule = zero-bubble`` runs: ScheduleInterleavedZeroBubble
    (looped stages) or ScheduleZBVZeroBubble (V-shaped, needs virtual_stages = 2)."""


def enabled(plan: Plan, layout: Layout) -> bool:
    """More than one pipeline stage."""
    return layout.pp > 1


def stage_style(layout: Layout, options: Options) -> StageStyle:
    """Where this layout's stages sit: V-shaped for ZBV, looped otherwise (:mod:`planc.stages`)."""
    return stages.stage_style(layout.schedule, options.zero_bubble)


def check(plan: Plan, layout: Layout, options: Options) -> str | None:
    """The pipeline rules of :mod:`planc.legality` for this layout and placement."""
    found = legality.pipeline_violations(plan, layout, stage_style(layout, options))
    return str(found[0]) if found else None


def apply(job: Job, options: Options) -> None:
    """Split the model into this rank's chunks; the schedule is built once the chunks are final."""
    from planc.strategies.pipeline.runtime import build_schedule, split_model

    style = stage_style(job.layout, options)
    split_model(job, style)
    job.schedule_builder = functools.partial(build_schedule, style=style)
