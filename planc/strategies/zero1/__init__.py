"""``zero1``: ZeRO stage 1 -- the optimizer state sharded over data parallelism.

``torch.distributed.optim.ZeroRedundancyOptimizer`` gives each data-parallel rank the optimizer
state of a 1/dp share of the parameters; after its share's step it broadcasts the updated
parameters (Rajbhandari et al. 2020, §5.1, P_os), one broadcast per rank: each rank's parameters
are views into one flat buffer. Gradients are still averaged by DistributedDataParallel, as in ``ddp``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planc.legality import rules as legality
from planc.spec.fields import Bytes
from planc.strategies.api import StrategyOptions
from planc.strategies.composition import after
from planc.strategies.zero1.cost_pass import cost as cost  # the plan-time cost pass (a contract hook)

if TYPE_CHECKING:
    from planc.runtime.job import Job
    from planc.spec.layout import Layout
    from planc.spec.plan import Plan

NAME = "zero1"
API_VERSION = 1
DESCRIPTION = "ZeRO-1: ZeroRedundancyOptimizer shards optimizer state over data parallel (+ DDP gradients)"
AFTER: tuple[str, ...] = after(NAME)


class Options(StrategyOptions):
    """Options of ``use zero1 { ... }``."""

    bucket: Bytes = 25e6
    """DDP gradient bucket size (as ``ddp``'s)."""


def enabled(plan: Plan, layout: Layout) -> bool:
    """ZeRO stage 1 (with more than one data-parallel rank)."""
    return layout.zero == 1 and layout.dp > 1


def check(plan: Plan, layout: Layout, options: Options) -> str | None:
    found = legality.needs_data_parallel("ZeRO-1", layout.dp)
    return str(found) if found else None


def apply(job: Job, options: Options) -> None:
    """DDP for the gradients (once the weights are real); ZeroRedundancyOptimizer over the "dp" group."""
    from planc.strategies.ddp.runtime import wrap_ddp
    from planc.strategies.zero1.runtime import zero_optimizer_factory

    job.after_init(lambda job: wrap_ddp(job, bucket_bytes=options.bucket))
    job.optimizer_factory = zero_optimizer_factory(job.group("dp"))
