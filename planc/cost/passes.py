"""Which cost passes run for a layout, in composition order: the active strategies' ``cost``.

Every strategy -- built-in or third-party -- contributes its pass through the same registry
(``planc.strategies.registry``), in the order of their ``AFTER`` graph: pipeline ->
tensor_parallel -> recompute -> bf16 -> ddp / zero1 / fsdp -> plugins that come after them.

The planner asks for thousands of layouts of one plan, and which strategies are active (and
their options) does not depend on the micro-batch size, so the answer is memoised per plan
object and per layout without its micro-batch.
"""

from __future__ import annotations

from planc.cost.estimate import CostPass
from planc.spec.layout import Layout
from planc.spec.plan import Plan

_MEMO: dict[tuple, tuple[Plan, list[CostPass]]] = {}
_MEMO_LIMIT = 4096


def _layout_key(layout: Layout) -> tuple:
    return (
        layout.tp,
        layout.pp,
        layout.dp,
        layout.zero,
        layout.recompute,
        layout.schedule,
        layout.virtual_stages,
        layout.sequence_parallel,
    )


def active_cost_passes(plan: Plan, layout: Layout) -> list[CostPass]:
    """The active strategies' cost passes for ``layout``, in composition order."""
    from planc.strategies.registry import load_registry

    registry = load_registry()
    key = (id(plan), id(registry), _layout_key(layout))
    hit = _MEMO.get(key)
    if hit is not None and hit[0] is plan:
        return hit[1]
    passes = [CostPass(s.name, s.cost, s.options_for(plan, layout)) for s in registry.active(plan, layout)]
    if len(_MEMO) >= _MEMO_LIMIT:
        _MEMO.clear()
    _MEMO[key] = (plan, passes)
    return passes
