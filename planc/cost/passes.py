"""Which cost passes run for a layout, in composition order.

This is the one place that decides it. Until the strategy registry
(``planc.strategies.registry``) is on main, it maps the layout to the built-in passes directly;
at merge it becomes::

    from planc.strategies.registry import load_registry
    return [CostPass(s.name, s.cost, s.options_for(plan))
            for s in load_registry().active(plan, layout) if s.cost is not None]

Composition order (the strategies' ``AFTER`` graph): pipeline -> tensor_parallel -> recompute
-> bf16 -> ddp / zero1 / fsdp.
"""

from __future__ import annotations

from planc.cost import builtin
from planc.cost.estimate import CostPass
from planc.spec.layout import Layout
from planc.spec.plan import Plan

_PIPELINE = CostPass("pipeline", builtin.pipeline)
_TENSOR_PARALLEL = CostPass("tensor_parallel", builtin.tensor_parallel)
_RECOMPUTE = CostPass("recompute", builtin.recompute)
_BF16 = CostPass("bf16", builtin.bf16)
_DDP = CostPass("ddp", builtin.ddp)
_ZERO1 = CostPass("zero1", builtin.zero1)
_FSDP = CostPass("fsdp", builtin.fsdp)


def active_cost_passes(plan: Plan, layout: Layout) -> list[CostPass]:
    """The built-in strategies active in ``layout``, in composition order."""
    passes = []
    if layout.pp > 1:
        passes.append(_PIPELINE)
    if layout.tp > 1:
        passes.append(_TENSOR_PARALLEL)
    if layout.recompute != "none":
        passes.append(_RECOMPUTE)
    if plan.train.precision == "bf16":
        passes.append(_BF16)
    if layout.dp > 1:
        passes.append({0: _DDP, 1: _ZERO1}.get(layout.zero, _FSDP))
    return passes
