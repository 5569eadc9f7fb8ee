"""Whether the strategies a plan names in ``use`` blocks accept at least one of its legal layouts.

A plugin's plan-time ``check(plan, layout, options)`` can refuse layouts (PowerSGD refuses
FSDP and dp = 1). When it refuses every layout the plan allows, nothing can be planned; this
is found while the plan is read (``planc check``, and every command that loads a plan), and
reported at the ``use`` block with the plugin's own message, instead of later as an unlocated
"no legal layout". No layout is scored: the legal layouts are walked (the planner's search
space, :mod:`planc.legality.space`) until one is accepted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from planc import stages
from planc.legality import space
from planc.planner.explore import families
from planc.spec.issues import SpecIssue
from planc.spec.layout import Layout
from planc.spec.plan import Plan

if TYPE_CHECKING:
    from planc.strategies.registry import Registry

#: Legal layouts walked at most; beyond it the plan is not refused here (the planner still is
#: exact: it never chooses a refused layout). A plan with every key auto on a large cluster has
#: a few thousand; the walk stops at the first accepted one.
MAX_LAYOUTS = 20_000


def legal_layouts(plan: Plan) -> Iterator[Layout]:
    """Every layout the planner could score, in its search order (micro-batch counts included)."""
    gb = plan.train.global_batch
    for family in families(plan):
        for schedule in family.schedules:
            if not space.schedule_composes(schedule[0], family.dp, family.zero):
                continue
            for mb in family.micro_batches:
                if not space.micro_batch_accepted(schedule[0], family.pp, stages.micro_batches(gb, family.dp, mb)):
                    continue
                for sp in family.sps:
                    for recompute in family.recomputes:
                        if space.recompute_composes(schedule[0], recompute):
                            yield family.layout(recompute, schedule, sp, mb)


def refused_everywhere(plan: Plan, registry: Registry) -> list[SpecIssue]:
    """An issue at the ``use`` block whose strategy refuses every legal layout (empty: some layout is
    accepted, the plan has no ``use`` blocks, or the walk was cut at :data:`MAX_LAYOUTS`)."""
    if not plan.uses:
        return []
    first: dict[str, tuple[str, Layout]] = {}
    for count, layout in enumerate(legal_layouts(plan)):
        if count >= MAX_LAYOUTS:
            return []
        reason = registry.refusal(plan, layout)
        if reason is None:
            return []
        name, _, message = reason.removeprefix("use ").partition(": ")
        first.setdefault(name, (message, layout))
    issues = []
    for index, use in enumerate(plan.uses):
        if use.name in first:
            message, layout = first[use.name]
            issues.append(
                SpecIssue(
                    ("uses", index, "name"),
                    f"strategy '{use.name}' refuses every layout this plan allows, e.g. {layout.describe()}: {message}",
                    "change the fixed layout keys or the devices so a layout it accepts is legal, "
                    "or remove this use block",
                )
            )
    return issues
