"""Run-time half of ``ddp`` (and of ``zero1``, whose gradients DDP averages): imports torch.

DistributedDataParallel cannot take DTensor parameters, so with tensor parallelism each part's
parameters become their local shards first (:mod:`planc.runtime.local_shards`).
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from planc.runtime.job import Job
from planc.runtime.local_shards import localize_dtensor_parameters


def wrap_ddp(job: Job, *, bucket_bytes: float) -> None:
    """Wrap each local model part in DistributedDataParallel over the "dp" group (after weights are real).

    Registers ``no_sync`` as the job's gradient-accumulation switch. The bucket size is given in
    bytes; DDP's ``bucket_cap_mb`` counts MiB.
    """
    group = job.group("dp")
    wrapped: list[nn.Module] = []
    for part in job.model_parts:
        localize_dtensor_parameters(part, job.local_shard_specs)
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

    def no_sync(sync: bool) -> AbstractContextManager[object]:
        if sync:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        for ddp in wrapped:
            assert isinstance(ddp, DistributedDataParallel)
            stack.enter_context(ddp.no_sync())
        return stack

    job.sync_controls.append(no_sync)
