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
virtual stages, HSDP), compared left to right: first the rung; within a rung the techniques below it
(so PP with DDP is simpler than PP with FSDP, and no recomputation simpler than full); then
the sizes (a larger TP or PP degree is more complex: more groups, more communication); last
hybrid sharding (HSDP, ZeRO-3 sharded inside a node and replicated across nodes: a 2-D mesh and
one more collective than plain ZeRO-3, so it wins only by beating plain ZeRO-3 by the margin;
it is not a rung of its own: it changes where ZeRO-3's collectives run, not what the rung does).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Protocol


class Rung(IntEnum):
    """A rung of the ladder; compares (and serialises) as its index."""

    SINGLE_DEVICE = 0
    DDP = 1
    ZERO1 = 2
    ZERO2 = 3
    ZERO3 = 4
    SELECTIVE_RECOMPUTE = 5
    FULL_RECOMPUTE = 6
    TP = 7
    TP_SP = 8
    PP_1F1B = 9
    PP_GPIPE = 10
    PP_INTERLEAVED = 11
    PP_ZERO_BUBBLE = 12

    @property
    def label(self) -> str:
        """How explain names the rung ("ZeRO-3 (FSDP)", "+ PP (1F1B)")."""
        return RUNGS[self]

    @property
    def pipelined(self) -> bool:
        return self >= Rung.PP_1F1B

    @property
    def tensor_parallel(self) -> bool:
        """TP without pipelining (the TP rungs proper)."""
        return self in (Rung.TP, Rung.TP_SP)

    @property
    def data_parallel(self) -> bool:
        """One of DDP, ZeRO-1/2/3: data parallelism without recomputation, TP or PP."""
        return Rung.DDP <= self <= Rung.ZERO3

    @property
    def zero(self) -> int | None:
        """The ZeRO stage a data-parallel rung stands for."""
        return int(self) - 1 if self.data_parallel else None

    @property
    def recompute(self) -> str | None:
        """The recomputation a recompute rung stands for."""
        return {Rung.SELECTIVE_RECOMPUTE: "selective", Rung.FULL_RECOMPUTE: "full"}.get(self)

    @property
    def schedule(self) -> str | None:
        """The pipeline schedule a pipeline rung stands for."""
        return next((s for s, r in _SCHEDULE_RUNG.items() if r == self), None)


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
_SCHEDULE_RUNG = {
    "1f1b": Rung.PP_1F1B,
    "gpipe": Rung.PP_GPIPE,
    "interleaved": Rung.PP_INTERLEAVED,
    "zero-bubble": Rung.PP_ZERO_BUBBLE,
}


class LayoutKeys(Protocol):
    """What the ladder reads of a layout (a :class:`~planc.spec.Layout`)."""

    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def dp(self) -> int: ...
    @property
    def zero(self) -> int: ...
    @property
    def recompute(self) -> str: ...
    @property
    def schedule(self) -> str | None: ...
    @property
    def sequence_parallel(self) -> bool: ...
    @property
    def virtual_stages(self) -> int: ...
    @property
    def shard_group(self) -> int | None: ...


def schedule_rung(schedule: str) -> Rung:
    """The rung of a pipeline schedule."""
    return _SCHEDULE_RUNG[schedule]


def rung_of(layout: LayoutKeys) -> Rung:
    """The most complex technique ``layout`` uses."""
    if layout.pp > 1 and layout.schedule is not None:
        return _SCHEDULE_RUNG[layout.schedule]
    if layout.tp > 1:
        return Rung.TP_SP if layout.sequence_parallel else Rung.TP
    if layout.recompute != "none":
        return Rung(Rung.ZERO3 + _RECOMPUTE_RANK[layout.recompute])
    if layout.dp > 1:
        return Rung(Rung.DDP + layout.zero)
    return Rung.SINGLE_DEVICE


def rung_name(layout: LayoutKeys) -> str:
    """How explain names a layout's place on the ladder: the rung's label, with "+ HSDP" when the
    layout shards in groups (HSDP sits on its ZeRO rung, last in the complexity rank)."""
    label = rung_of(layout).label
    return f"{label} + HSDP" if layout.shard_group is not None else label


def tier(rank: tuple[int, ...]) -> tuple[int, ...]:
    """A :func:`complexity` rank without the pipeline's depth (its pp place) and without sequence
    parallelism (its rung and its place): the planner's pick treats layouts that differ only in
    these as equally simple (:func:`planc.planner.choose.pick`), decided by speed and memory.

    Sequence parallelism is how tensor parallelism is run in practice (Korthikanti et al. 2022:
    the all-reduce becomes a reduce-scatter and an all-gather of the same volume, and the norms'
    and dropout's activations are sharded t ways; Megatron-LM and torchtitan turn it on with TP):
    it is a rung of its own in explain, but as a tie-break rank it made the planner keep TP 4
    without it at 97% of an H100 when the same layout with it ran 2% faster in 48 GiB instead of 74
    (Llama 3 8B at 128 k context)."""
    rung = Rung.TP if rank[0] == Rung.TP_SP else rank[0]
    return (rung, *(place for i, place in enumerate(rank) if i not in (0, 3, 5)))


def complexity(layout: LayoutKeys) -> tuple[int, ...]:
    """The complexity rank: smaller is simpler."""
    return (
        rung_of(layout),
        _RECOMPUTE_RANK[layout.recompute],
        layout.zero,
        int(layout.sequence_parallel),
        layout.tp,
        layout.pp,  # place 5: tier() leaves it out (and place 3)
        layout.virtual_stages,
        int(layout.shard_group is not None),
    )
