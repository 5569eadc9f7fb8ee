"""The validation loss: forward passes over held-out batches, for any composition of strategies.

Evaluation ``k`` of a run reads validation batches ``0 .. eval_batches-1`` -- the same global
batches every time, so the curve compares like with like -- cut into data-parallel shares and
micro-batches exactly as training cuts its batches (so a pipeline schedule sees the micro-batch
count it was built for). Without pipelining each micro-batch runs the model under
``torch.no_grad``; with pipelining the schedule's own ``eval`` runs forward only. The result is
the mean next-token loss over every token of those batches, the same number on every rank and
for every layout (the same reduction as the training loss, :func:`planc.runtime.step.train_step`).
"""

from __future__ import annotations

import torch

from planc.runtime.data import DataSource, inputs_and_targets, split_micro_batches
from planc.runtime.step import _global_mean_loss, _plain, rank_batch
from planc.runtime.transformer import loss_fn


@torch.no_grad()
def validation_loss(job, data: DataSource, batches: int) -> float:
    """Mean loss over validation batches ``0 .. batches-1`` of ``data``."""
    losses = [_batch_loss(job, rank_batch(job, data, index)) for index in range(batches)]
    return sum(losses) / len(losses)


def _batch_loss(job, batch: torch.Tensor) -> float:
    """The global mean loss of a validation batch, from this rank's rows ``batch``."""
    micro_batches = [
        inputs_and_targets(rows.to(job.device)) for rows in split_micro_batches(batch, job.layout.micro_batch)
    ]
    if job.schedule is not None:
        local = _pipeline_forward(job, micro_batches)
    else:
        (model,) = job.model_parts
        total = torch.zeros((), device=job.device)
        for inputs, targets in micro_batches:
            with job.loss_context():
                total += _plain(loss_fn(model(inputs), targets, job.plan.model.vocab)).float()
        local = total / len(micro_batches)
    return _global_mean_loss(job, local)


def _pipeline_forward(job, micro_batches: list) -> torch.Tensor | None:
    """The schedule's forward-only pass; the last stage returns the micro-batch losses' mean (its
    logits are not kept: :func:`planc.runtime.step._pipeline_forward_backward` says why)."""
    losses: list[torch.Tensor] = []
    args = (torch.cat([x for x, _ in micro_batches]),) if job.is_first_stage else ()
    kwargs = {"target": torch.cat([y for _, y in micro_batches]), "losses": losses} if job.is_last_stage else {}
    with job.loss_context():
        job.schedule.eval(*args, return_outputs=False, **kwargs)
    if not job.is_last_stage:
        return None
    return torch.stack([_plain(loss).float() for loss in losses]).mean()
