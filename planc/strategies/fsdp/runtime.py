"""Run-time half of ``fsdp`` (imports torch): FSDP2 ``fully_shard`` per block and per model part."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from planc.runtime.job import Job


def shard_mesh(job: Job) -> DeviceMesh:
    """The mesh FSDP2 shards over: the "dp" dimension, or with a shard group (HSDP) that
    dimension unflattened into ("dp_replicate", "dp_shard") -- shard groups of adjacent dp ranks
    (inside a node, as tp is innermost), replicated across groups. FSDP2 treats a 2-D mesh as
    HSDP: it shards over the last dimension and all-reduces gradients over the first."""
    group = job.layout.shard_group
    if not group:
        return job.mesh["dp"]
    names = ("dp_replicate", "dp_shard")
    hybrid = job.mesh._unflatten("dp", (job.layout.replicate_groups, group), names)
    job.shard_mesh = hybrid[names]  # its new groups get the plan's collective timeout (runtime/hangs.py)
    return job.shard_mesh


def shard_model_parts(job: Job, *, reshard: bool, accumulate_unsharded: bool) -> None:
    """``fully_shard`` every block, then each model part's root, over the "dp" mesh dimension, with
    the ``bf16`` policy when there is one; optionally defer gradient reduction to the last
    micro-batch of a step."""
    kwargs: dict[str, Any] = {"mesh": shard_mesh(job), "reshard_after_forward": reshard}
    policy = job.take_mixed_precision()
    if policy is not None:
        kwargs["mp_policy"] = policy
    for part in job.transformers():
        for block in part.layers.values():
            fully_shard(block, **kwargs)
        # The root holds the embeddings, the final norm and the head; with pipelining the schedule
        # calls backward soon after forward, so there is nothing to gain from resharding it.
        fully_shard(part, **{**kwargs, "reshard_after_forward": reshard and not job.layout.pp > 1})

    if not accumulate_unsharded:
        return  # FSDP2 reduce-scatters after every backward and accumulates into the sharded grads

    job.sync_controls.append(fsdp_gradient_sync(job))


def fsdp_gradient_sync(job: Job):
    """The ``sync_controls`` entry for FSDP2-managed parts (``fully_shard`` or ``replicate``): turns
    their gradient reduction off for the micro-batches that only accumulate."""

    @contextlib.contextmanager
    def gradient_sync(sync: bool) -> Iterator[None]:
        parts = [part for part in job.model_parts if isinstance(part, FSDPModule)]
        for part in parts:
            part.set_requires_gradient_sync(sync)
        try:
            yield
        finally:
            for part in parts:
                part.set_requires_gradient_sync(True)

    return gradient_sync
