"""Run-time half of ``ddp`` (and of ``zero1``, whose gradients DDP averages): imports torch.

Two PyTorch wrappers, one per precision:

* fp32: ``DistributedDataParallel``. It cannot take DTensor parameters, so with tensor
  parallelism each part's parameters become their local shards first
  (:mod:`planc.runtime.local_shards`).
* bf16: the composable ``replicate`` built on FSDP2
  (``torch.distributed._composable.replicate_with_fsdp``), per block and per part, with the
  ``bf16`` strategy's ``MixedPrecisionPolicy``: the same bf16 working weights and activations as
  FSDP (fp32 master parameters, bf16 copies for forward and backward, gradients all-reduced and
  accumulated in fp32), instead of ``torch.autocast`` over fp32 parameters (why: docs/strategies.md).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from planc.runtime.job import Job
from planc.runtime.local_shards import localize_dtensor_parameters
from planc.strategies.fsdp.runtime import fsdp_gradient_sync


def wrap_ddp(job: Job, *, bucket_bytes: float) -> None:
    """Wrap each local model part in DistributedDataParallel over the "dp" group (after weights are real).

    Registers ``no_sync`` as the job's gradient-accumulation switch. The bucket size is given in
    bytes; DDP's ``bucket_cap_mb`` counts MiB.
    """
    group = job.group("dp")
    wrapped: list[nn.Module] = []
    for part in job.model_parts:
        partial_sums = job.partial_sum_shards if job.layout.sequence_parallel and job.layout.tp > 1 else None
        localize_dtensor_parameters(part, job.local_shard_specs, partial_sums)
        give_zero_gradients(part)
        wrapped.append(
            DistributedDataParallel(
                part,
                process_group=group,
                bucket_cap_mb=bucket_bytes / 2**20,
                device_ids=[job.device.index] if job.device.type == "cuda" else None,
                # Under pipelining the schedule drives DDP's reducer by hand (no_sync for every micro-batch
                # but the last, then reducer.prepare_for_backward). With DDP's defaults the reducer records
                # each parameter once per micro-batch on the first step and its bucket rebuild fails
                # ("rebuilt parameter indices size is not same as original model parameters size");
                # static_graph=True runs but averages wrongly (its losses leave the reference at step 2).
                # find_unused_parameters=True skips the bucket rebuild and matches the reference.
                find_unused_parameters=job.layout.pp > 1,
                # Gradients live in DDP's buckets instead of beside them: saves a full copy of the
                # gradients (4 bytes per parameter in fp32), as PyTorch's DDP docs describe.
                gradient_as_bucket_view=True,
            )
        )
    job.model_parts = wrapped
    job.gradients_in_buckets = True

    def no_sync(sync: bool) -> AbstractContextManager[object]:
        if sync:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        for ddp in wrapped:
            assert isinstance(ddp, DistributedDataParallel)
            stack.enter_context(ddp.no_sync())
        return stack

    job.sync_controls.append(no_sync)


def give_zero_gradients(part: nn.Module) -> None:
    """Give every trainable parameter a zero gradient before DDP wraps ``part``: the reducer then
    makes each gradient a view into its bucket at once (``gradient_as_bucket_view``), and the step
    zeroes them in place (``Job.gradients_in_buckets``) so that they stay views.

    Why: a gradient that is None when backward reaches it is created beside the bucket. Under
    ``no_sync`` (every micro-batch but the last) autograd keeps it there, and the reducer copies it
    into the bucket only in the synchronising backward: with the gradients set to None at each step
    a rank held every gradient twice through its accumulation, g bytes per parameter more than the
    buckets (found by ``planc verify --simulate``; tests/verify/test_simulate.py).
    The zeros are made at initialisation, before any activation or optimizer state exists."""
    for param in part.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)


def replicate_model_parts(job: Job) -> None:
    """bf16 data parallelism: ``replicate`` (FSDP2's machinery, replicate-only mesh) every block, then
    each model part's root, over the "dp" mesh dimension, taking the ``bf16`` policy.

    Like ``fully_shard`` it works on the meta model (the parameters become replicated DTensors,
    initialised later by ``job.init_weights``); gradients are all-reduced once per step: every
    micro-batch but the last runs with ``set_requires_gradient_sync(False)``, and FSDP2 accumulates
    those gradients in the policy's fp32 ``reduce_dtype``.
    """
    from torch.distributed._composable.replicate_with_fsdp import replicate

    policy = job.take_mixed_precision()
    if policy is None:
        raise RuntimeError("replicate_model_parts needs the bf16 strategy's policy (train.precision = bf16)")
    mesh = job.mesh["dp"]
    for part in job.transformers():
        for block in part.layers.values():
            replicate(block, mesh=mesh, mp_policy=policy)
        replicate(part, mesh=mesh, mp_policy=policy)

    job.sync_controls.append(fsdp_gradient_sync(job))
