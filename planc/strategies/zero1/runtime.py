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
        # parameters_as_bucket_view: each rank's parameters become views into one flat buffer, so the
        # step's parameter sync is one broadcast per rank. torch's default (False) broadcasts tensor by
        # tensor: 39-69 start-ups per step for the CPU matrix's tiny models, 8-15 ms on 2 gloo ranks,
        # half the step (docs/accuracy.md, "ZeRO-1's parameter broadcasts"). The views are what the
        # model computes with; DDP, the localized TP shards' DTensor views (rebuilt from the parameter
        # at every forward) and checkpoints (loaded by copy) read the same tensors.
        return ZeroRedundancyOptimizer(
            template.param_groups,
            optimizer_class=optimizer_class,
            process_group=group,
            parameters_as_bucket_view=True,
            **defaults,
        )

    return zero_optimizer
