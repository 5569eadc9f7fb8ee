"""``zero1``: ZeRO stage 1 -- the optimizer state sharded over data parallelism.

``torch.distributed.optim.ZeroRedundancyOptimizer`` gives each data-parallel rank the optimizer
state of a 1/dp share of the parameters; after its share's step it broadcasts the updated
parameters (Rajbhandari et al. 2020, §5.1, P_os). Gradients are still averaged by
DistributedDataParallel, as in ``ddp``.
"""

from __future__ import annotations

from planc.legality import rules as legality
from planc.spec.fields import Bytes
from planc.strategies.api import StrategyOptions
from planc.strategies.composition import after
from planc.strategies.zero1.cost_pass import cost as cost  # the plan-time cost pass (a contract hook)

NAME = "zero1"
API_VERSION = 1
DESCRIPTION = "ZeRO-1: ZeroRedundancyOptimizer shards optimizer state over data parallel (+ DDP gradients)"
AFTER = after(NAME)


class Options(StrategyOptions):
    """Options of ``use zero1 { ... }``."""

    bucket: Bytes = 25e6
    """DDP gradient bucket size (as ``ddp``'s)."""


def enabled(plan, layout) -> bool:
    """ZeRO stage 1 (with more than one data-parallel rank)."""
    return layout.zero == 1 and layout.dp > 1


def check(plan, layout, options: Options) -> str | None:
    found = legality.needs_data_parallel("ZeRO-1", layout.dp)
    return str(found) if found else None


def apply(job, options: Options) -> None:
    """DDP for the gradients (once the weights are real); ZeroRedundancyOptimizer over the "dp" group."""
    from planc.runtime.local_shards import wrap_ddp

    job.after_init(lambda job: wrap_ddp(job, bucket_bytes=options.bucket))

    def zero_optimizer(template):
        """A ZeroRedundancyOptimizer with the plan optimizer's class, parameter groups and settings."""
        import inspect

        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer_class = type(template)
        # Optimizer.defaults may hold entries the constructor does not take (AdamW's decoupled_weight_decay).
        accepted = inspect.signature(optimizer_class.__init__).parameters
        defaults = {k: v for k, v in template.defaults.items() if k in accepted}
        return ZeroRedundancyOptimizer(
            template.param_groups, optimizer_class=optimizer_class, process_group=job.group("dp"), **defaults
        )

    job.optimizer_factory = zero_optimizer
