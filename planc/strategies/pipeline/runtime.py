"""Run-time half of ``pipeline`` (imports torch): the manual stage split and the schedule."""

from __future__ import annotations

import copy
from functools import partial

import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining.schedules import _PipelineSchedule
from torch.distributed.pipelining.stage import _PipelineStageBase

from planc.cost.memory import SCHEDULES_HOLDING_LOGITS
from planc.runtime.job import Job, TiedWeight
from planc.runtime.loss import Backward
from planc.runtime.transformer import loss_fn as model_loss_fn
from planc.stages import StageStyle, layer_ranges, micro_batches, stages_of_rank

SINGLE_STAGE_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
MULTI_STAGE_SCHEDULES = {"interleaved": ScheduleInterleaved1F1B, "zero-bubble": ScheduleInterleavedZeroBubble}


def split_model(job: Job, style: StageStyle) -> None:
    """Replace the job's full (meta) model by this rank's stages (placed by ``style``), each keeping
    its parameter names."""
    if len(job.model_parts) != 1:
        raise RuntimeError("pipeline must be applied first, to the whole model")
    (full,) = job.transformers()
    layout = job.layout
    num_stages = layout.pp * layout.virtual_stages
    ranges = layer_ranges(len(full.layers), num_stages)
    local_stages = list(stages_of_rank(job.coordinates["pp"], layout.pp, layout.virtual_stages, style))
    parts: list[nn.Module] = []
    for stage in local_stages:
        part = copy.deepcopy(full)  # on the meta device: no memory
        keep = {str(i) for i in ranges[stage]}
        for name in list(part.layers):
            if name not in keep:
                del part.layers[name]
        if stage != 0:
            part.tok_embeddings = None
            part.pos_embeddings = None
        if stage != num_stages - 1:
            part.norm = None
            part.output = None
        parts.append(part)
    job.model_parts, job.stage_indices, job.num_stages = parts, local_stages, num_stages
    if full.spec.tie_embeddings:
        job.after_init(_tie_first_and_last_stage)


def _tie_first_and_last_stage(job: Job) -> None:
    """Megatron's tied embedding across stages: the first stage's embedding and the last stage's output
    weight start equal (init is by canonical name) and have their gradients summed after backward."""
    pp = job.layout.pp
    coords = job.coordinates
    # One group per (dp, tp) coordinate: the first and the last pipeline rank. Every rank creates
    # every group, in the same order, as new_group requires.
    mine = None
    for dp_rank in range(job.layout.dp):
        for tp_rank in range(job.layout.tp):
            ranks = [_global_rank(job, p, dp_rank, tp_rank) for p in (0, pp - 1)]
            group = dist.new_group(ranks)
            if (dp_rank, tp_rank) == (coords["dp"], coords["tp"]):
                mine = group
    for part, stage in zip(job.transformers(), job.stage_indices):
        if stage == 0 and part.tok_embeddings is not None:
            job.tied_weights.append(TiedWeight(part.tok_embeddings, "weight", mine, counted=True))
        if stage == job.num_stages - 1 and part.output is not None:
            job.tied_weights.append(TiedWeight(part.output, "weight", mine, counted=False))


def _global_rank(job: Job, pp_rank: int, dp_rank: int, tp_rank: int) -> int:
    return (pp_rank * job.layout.dp + dp_rank) * job.layout.tp + tp_rank


def build_schedule(job: Job, style: StageStyle) -> _PipelineSchedule:
    """A PipelineStage per local chunk and the schedule the layout names."""
    group = job.group("pp")
    job.stages = [
        PipelineStage(part, stage, job.num_stages, job.device, group=group)
        for part, stage in zip(job.model_parts, job.stage_indices)
    ]
    stages: list[_PipelineStageBase] = list(job.stages)
    n_micro = micro_batches(job.plan.train.global_batch, job.layout.dp, job.layout.micro_batch)
    schedule = job.layout.schedule or ""
    # The stage keeps each micro-batch's logits until its backward. Plain logits get their gradient
    # written over them in the forward; vocabulary-sharded DTensor logits (TP) would keep their
    # chunks' gradients beside them, which where the schedule runs several of the last stage's
    # forwards first doubles what each holds: their loss recomputes its chunks in backward there
    # (planc.cost.memory.loss_kind).
    holding = schedule in SCHEDULES_HOLDING_LOGITS and job.layout.tp > 1
    backward: Backward = "recompute" if holding else "in_forward"
    loss_fn = partial(model_loss_fn, vocab=job.plan.model.vocab, backward=backward)
    if schedule in SINGLE_STAGE_SCHEDULES:
        return SINGLE_STAGE_SCHEDULES[schedule](stages[0], n_microbatches=n_micro, loss_fn=loss_fn, scale_grads=True)
    if style == "v":
        return ScheduleZBVZeroBubble(stages, n_microbatches=n_micro, loss_fn=loss_fn, scale_grads=True)
    return MULTI_STAGE_SCHEDULES[schedule](stages, n_microbatches=n_micro, loss_fn=loss_fn, scale_grads=True)
