"""Run-time half of ``zero1`` (imports torch): the plan's optimizer as a ZeroRedundancyOptimizer."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.optim import Optimizer


def zero_optimizer_factory(group: dist.ProcessGroup) -> Callable[[Optimizer], Optimizer]:
    """``template -> ZeroRedundancyOptimizer`` of the template's class, parameter groups and settings,
    its states sharded over ``group`` (the "dp" group)."""

    def zero_optimizer(template: Optimizer) -> Optimizer:
        optimizer_class = type(template)
        # Optimizer.defaults may hold entries the constructor does not take (AdamW's decoupled_weight_decay).
        accepted = inspect.signature(optimizer_class.__init__).parameters
        defaults = {k: v for k, v in template.defaults.items() if k in accepted}
        return ZeroRedundancyOptimizer(
            template.param_groups, optimizer_class=optimizer_class, process_group=group, **defaults
        )

    return zero_optimizer
