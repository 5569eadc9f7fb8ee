"""``ddp``: data parallelism with ``torch.nn.parallel.DistributedDataParallel`` (ZeRO stage 0).

Every data-parallel rank holds the whole model (or its tensor/pipeline shard) and all-reduces
gradients in buckets that overlap with backward. Gradient accumulation runs the micro-batches
but the last under ``no_sync()``, so the all-reduce happens once per optimizer step.

With tensor parallelism, DDP -- which cannot take DTensor parameters -- gets the local shards
as plain parameters (see :mod:`planc.runtime.local_shards`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planc.legality import rules as legality
from planc.spec.fields import Bytes, Flag
from planc.strategies.api import StrategyOptions
from planc.strategies.composition import after
from planc.strategies.ddp.cost_pass import cost as cost  # the plan-time cost pass (a contract hook)

if TYPE_CHECKING:
    from planc.runtime.job import Job
    from planc.spec.layout import Layout
    from planc.spec.plan import Plan

NAME = "ddp"
API_VERSION = 1
DESCRIPTION = "Data parallelism: DistributedDataParallel, bucketed gradient all-reduce (ZeRO-0)"
AFTER: tuple[str, ...] = after(NAME)


class Options(StrategyOptions):
    """Options of ``use ddp { ... }``."""

    bucket: Bytes = 25e6
    """Gradient bucket size: gradients are all-reduced in buckets of about this many bytes (25 MB).
    DistributedDataParallel's; with bf16 weights ``replicate`` all-reduces one block at a time."""
    bf16_weights: Flag = True
    """With ``precision = bf16``: compute with bf16 copies of the fp32 parameters, as FSDP does
    (FSDP2's ``replicate`` with the bf16 MixedPrecisionPolicy). false: DistributedDataParallel
    under ``torch.autocast`` over fp32 parameters (slower, fp32 residual stream), which takes
    DDP communication hooks such as the powersgd plugin."""


def enabled(plan: Plan, layout: Layout) -> bool:
    """More than one data-parallel rank, no ZeRO sharding."""
    return layout.dp > 1 and layout.zero == 0


def check(plan: Plan, layout: Layout, options: Options) -> str | None:
    found = legality.needs_data_parallel("DDP", layout.dp)
    return str(found) if found else None


def apply(job: Job, options: Options) -> None:
    """Data parallelism over the "dp" mesh dimension: with bf16, ``replicate`` (FSDP2 machinery)
    and the bf16 policy; else DistributedDataParallel around each local model part.

    DDP needs real tensors (it broadcasts and buckets them), so that wrapping runs once the weights
    are initialised (``job.after_init``); ``replicate``, like ``fully_shard``, wraps the meta model.
    """
    from planc.strategies.ddp.runtime import replicate_model_parts, wrap_ddp

    if job.mp_policy is not None and options.bf16_weights:
        replicate_model_parts(job)
    else:
        job.after_init(lambda job: wrap_ddp(job, bucket_bytes=options.bucket))
