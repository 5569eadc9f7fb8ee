"""The ladder of strategies and the complexity rank that orders layouts on it.

A layout's **rung** is the most complex technique it uses, in this order (each rung adds one
thing an engineer has to understand, debug and pay for):

 0 single device
 1 DDP                      data parallel, replicated model states
 2 ZeRO-1                   + sharded optimizer states
 3 ZeRO-2                   + sharded gradients
 4 ZeRO-3 (FSDP)            + sharded parameters
 5 + selective recompute
 6 + full recompute
 7 + TP                     tensor parallel inside a node
 8 + TP + SP                and sequence parallel
 9 + PP (1F1B)              pipeline stages
10 + PP (GPipe)
11 + PP (interleaved)       virtual stages
12 + PP (zero-bubble)

The **complexity rank** is the tuple (rung, recompute, ZeRO stage, sequence parallel, tp, pp,
virtual stages), compared left to right: first the rung; within a rung the techniques below it
(so PP with DDP is simpler than PP with FSDP, and no recomputation simpler than full); last
the sizes (a larger TP or PP degree is more complex: more groups, more communication).
"""

from __future__ import annotations

from planc.spec.layout import Layout

RUNGS = (
    "single device",
    "DDP",
    "ZeRO-1",
    "ZeRO-2",
    "ZeRO-3 (FSDP)",
    "+ selective recompute",
    "+ full recompute",
    "+ TP",
    "+ TP + SP",
    "+ PP (1F1B)",
    "+ PP (GPipe)",
    "+ PP (interleaved)",
    "+ PP (zero-bubble)",
)
_RECOMPUTE_RANK = {"none": 0, "selective": 1, "full": 2}
_SCHEDULE_RUNG = {"1f1b": 9, "gpipe": 10, "interleaved": 11, "zero-bubble": 12}


def schedule_rung(schedule: str) -> int:
    """The rung of a pipeline schedule."""
    return _SCHEDULE_RUNG[schedule]


def rung_of(layout: Layout) -> int:
    """Index in :data:`RUNGS` of the most complex technique ``layout`` uses."""
    return rung_for(
        layout.tp, layout.pp, layout.dp, layout.zero, layout.recompute, layout.schedule, layout.sequence_parallel
    )


def rung_for(tp: int, pp: int, dp: int, zero: int, recompute: str, schedule: str | None, sp: bool) -> int:
    """:func:`rung_of` from the layout's keys."""
    if pp > 1:
        return _SCHEDULE_RUNG[schedule]
    if tp > 1:
        return 8 if sp else 7
    if recompute != "none":
        return 4 + _RECOMPUTE_RANK[recompute]
    if dp > 1:
        return 1 + zero
    return 0


def complexity(layout: Layout) -> tuple:
    """The complexity rank: smaller is simpler."""
    return (
        rung_of(layout),
        _RECOMPUTE_RANK[layout.recompute],
        layout.zero,
        int(layout.sequence_parallel),
        layout.tp,
        layout.pp,
        layout.virtual_stages,
    )


def rung_name(index: int) -> str:
    return RUNGS[index]
