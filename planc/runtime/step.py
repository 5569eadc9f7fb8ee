"""One optimizer step, for any composition of strategies.

The bar: for every layout the loss and the gradients equal those of a single process over the
same global batch. Each micro-batch loss is a mean over its tokens and every micro-batch has the
same number of tokens, so

    global mean = mean over dp ranks of (mean over that rank's micro-batches of micro-batch means).

* without pipelining, each micro-batch's loss is divided by the number of micro-batches before
  backward (gradient accumulation; reduction only on the last, see ``Job.gradient_sync``) and
  DDP/FSDP average over the data-parallel ranks;
* with pipelining, the schedule runs the micro-batches and divides the gradients by their number
  (``scale_grads``), and the stage's DDP/FSDP averages over data parallelism.

The logged loss is the same mean, made known to every rank after the optimizer step and read
(with the gradient norm) only then, so the step has no host-device synchronisation in its middle:
on a GPU the host keeps queueing the optimizer's kernels while backward finishes, as a
hand-written loop that logs nothing would. It travels with each rank's stop flag and peak memory
(:mod:`planc.runtime.step_summary`: one all-gather on up to 64 ranks), so a step meets the other
ranks once for its bookkeeping, not once for each number.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.distributed as dist

from planc.runtime.data import DataSource, inputs_and_targets, local_batch, split_micro_batches
from planc.runtime.grad_norm import clip_to_norm, grad_norm
from planc.runtime.optim import reduce_partial_gradients, sum_in_place
from planc.runtime.step_summary import StepSummary, loss_share
from planc.runtime.transformer import loss_fn


def rank_batch(job, source: DataSource, step: int) -> torch.Tensor:
    """This rank's rows of ``source``'s batch of ``step`` (its data-parallel share; the same rows on
    every rank of its tensor- and pipeline-parallel groups): ``[G / dp, seq + 1]``."""
    return local_batch(source, step, job.coordinates["dp"], job.layout.dp, job.layout.micro_batch)


def train_step(
    job, batch: torch.Tensor, stop_requested: object = False, before_sync: Callable[[], None] | None = None
) -> dict:
    """Forward, backward, clip and update on ``batch``, this rank's rows of one global batch
    (:func:`rank_batch`: ``[G / dp, seq+1]``).

    ``stop_requested`` (truthy once this rank was asked to stop; read after the optimizer step) is
    voted on with the loss. ``before_sync`` runs once the step's work is queued and before its
    results are read on the host: on a GPU, host work done there (the next step's rows) overlaps
    the device's. Returns ``{"loss": ..., "grad_norm": ..., "lr": ..., "memory_bytes": ...,
    "stop": ...}``, the same on every rank: ``memory_bytes`` is the step's peak memory on the
    busiest rank (:func:`~planc.runtime.metrics.peak_memory_bytes`), ``stop`` is True when any rank
    asked.
    """
    local_loss, total_norm, lr = optimizer_step(job, batch)
    # Its loss, stop vote and peak memory travel over the ranks while ``before_sync`` works.
    summary = StepSummary(job, local_loss, stop_flag=bool(stop_requested))
    if before_sync is not None:
        before_sync()
    loss, stops, memory = summary.results()
    # One copy to the host for the four numbers: on a GPU each ``.item()`` is a wait of its own.
    numbers = torch.stack([loss, total_norm.double(), stops, memory])
    loss_value, norm_value, votes, peak = numbers.tolist()
    return {"loss": loss_value, "grad_norm": norm_value, "lr": lr, "memory_bytes": int(peak), "stop": votes > 0}


def optimizer_step(job, batch: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor, float]:
    """:func:`train_step` without its summary: this rank's mean loss over its micro-batches (a
    tensor; None on a pipeline stage that is not the last), the gradient norm (a tensor) and the
    learning rate. ``planc verify --simulate`` runs this on fake tensors, which have no values to read."""
    micro_batches = [
        inputs_and_targets(rows.to(job.device)) for rows in split_micro_batches(batch, job.layout.micro_batch)
    ]
    clear_gradients(job)
    if job.schedule is not None:
        local_loss = _pipeline_forward_backward(job, micro_batches)
    else:
        local_loss = _accumulate(job, micro_batches)
    if job.layout.sequence_parallel and job.layout.tp > 1:
        # the norms' replicated parameters: their gradients summed over tp once, not per optimizer
        # op (DTensor parameters) or per micro-batch and tensor (DDP's local shards)
        reduce_partial_gradients(job.local_parameters)
        sum_in_place([p.grad for p in job.partial_sum_shards if p.grad is not None], [job.group("tp")])
    _sum_tied_gradients(job)
    lr = job.lr_schedulers[0].get_last_lr()[0]
    total_norm = clip_grad_norm(job, job.plan.train.grad_clip)
    for optimizer, scheduler in zip(job.optimizers, job.lr_schedulers):
        optimizer.step()
        scheduler.step()
    return local_loss, total_norm, lr


def clear_gradients(job) -> None:
    """Drop the last step's gradients: set them to None, or zero them in place where they are
    views into DDP's buckets (``job.gradients_in_buckets``), which must stay views."""
    if not job.gradients_in_buckets:
        for optimizer in job.optimizers:
            optimizer.zero_grad(set_to_none=True)
        return
    grads = [p.grad for p in job.local_parameters if p.grad is not None]
    if grads:
        torch._foreach_zero_(grads)


def _accumulate(job, micro_batches: list) -> torch.Tensor:
    """Micro-batches through the single model part; gradients reduced only on the last."""
    (model,) = job.model_parts
    count = len(micro_batches)
    total = torch.zeros((), device=job.device)
    for index, (inputs, targets) in enumerate(micro_batches):
        with job.gradient_sync(index == count - 1), job.loss_context():
            loss = loss_fn(model(inputs), targets, job.plan.model.vocab) / count
            loss.backward()
        total += _plain(loss.detach())
    return total


def _pipeline_forward_backward(job, micro_batches: list) -> torch.Tensor | None:
    """The schedule runs the rank's rows as micro-batches (it splits them again, into the same ones);
    the last stage returns their losses, None elsewhere.

    ``return_outputs=False``: by default the schedule keeps every micro-batch's output on the last
    stage -- its logits -- to concatenate and return them after the step: micro-batches x logits of
    memory (8.4 GB at Llama 3 8B, TP 8, 32 micro-batches of 8192 tokens, found by
    ``planc verify --simulate``) and a copy of them all, for a value training never reads."""
    inputs = torch.cat([x for x, _ in micro_batches])
    targets = torch.cat([y for _, y in micro_batches])
    losses: list[torch.Tensor] = []
    args = (inputs,) if job.is_first_stage else ()
    kwargs = {"target": targets, "losses": losses} if job.is_last_stage else {}
    with job.loss_context():
        job.schedule.step(*args, return_outputs=False, **kwargs)
    if not job.is_last_stage:
        return None
    return torch.stack([_plain(loss.detach()) for loss in losses]).mean()


def _plain(value: torch.Tensor) -> torch.Tensor:
    """A DTensor loss (under loss parallel it is replicated) as a plain tensor."""
    return value.full_tensor() if hasattr(value, "full_tensor") else value


def _global_mean_loss(job, local_loss: torch.Tensor | None) -> float:
    """The global-batch mean loss on every rank, now (the validation loss uses it): one all-reduce of
    the ranks' shares (:func:`~planc.runtime.step_summary.loss_share`)."""
    value = loss_share(job, local_loss, torch.float32)
    dist.all_reduce(value)
    return float(value.item())


def _sum_tied_gradients(job) -> None:
    """All-reduce the gradients of weights shared between the first and the last pipeline stage."""
    for tied in job.tied_weights:
        grad = tied.param.grad
        if grad is None:
            raise RuntimeError("a tied embedding has no gradient after backward")
        local = grad.to_local() if hasattr(grad, "to_local") else grad
        dist.all_reduce(local, group=tied.group)


@torch.no_grad()
def clip_grad_norm(job, max_norm: float) -> torch.Tensor:
    """Clip the global gradient norm (every parameter of every rank, each counted once) to ``max_norm``.

    The norm is :func:`planc.runtime.grad_norm.grad_norm` (shards reduced over their mesh, stages
    summed over the pipeline group), worked on the local shards: a tensor-parallel shard that DDP
    holds as a plain tensor is described by its DTensor spec, and the last stage's copy of a tied
    embedding is left out of the norm (it is still rescaled). Returns the norm before clipping, as
    a tensor (read it after the optimizer step: reading it here would stall the step on a GPU).
    """
    uncounted = {id(t.param) for t in job.tied_weights if not t.counted}
    params = [p for p in job.local_parameters if p.grad is not None]
    counted: list = params  # objects with a .grad (and a .spec where one is needed), as grad_norm expects
    if job.local_shard_specs or uncounted:  # else the parameters themselves, with nothing built per step
        specs = job.local_shard_specs
        counted = [SimpleNamespace(grad=p.grad, spec=specs.get(p)) for p in params if id(p) not in uncounted]
    pp_group = job.group("pp") if job.layout.pp > 1 else None
    total = grad_norm(counted, 2.0, pp_group, device=job.device)
    if max_norm > 0:
        clip_to_norm(params, max_norm, total)
    return total
