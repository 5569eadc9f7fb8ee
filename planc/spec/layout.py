"""The ``layout`` block: the requested parallel layout; every key may be ``auto``.

A fixed key is obeyed, never changed; the planner fills in the rest.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from planc.legality.rules import hybrid_shard_group, resolved_layout
from planc.spec.fields import Auto, Flag, PositiveInt, PositiveIntOrAuto, SpecModel
from planc.stages import micro_batches

Recompute = Literal["none", "selective", "full"]
Schedule = Literal["gpipe", "1f1b", "interleaved", "zero-bubble"]
ZeroStage = Literal[0, 1, 2, 3]


class LayoutSpec(SpecModel):
    """Tensor x pipeline x data parallel degrees and the memory-saving techniques."""

    tp: PositiveIntOrAuto = "auto"
    """Tensor-parallel degree (inside a node; must divide heads and kv_heads)."""
    pp: PositiveIntOrAuto = "auto"
    """Pipeline-parallel degree (number of stages; at most layers)."""
    dp: PositiveIntOrAuto = "auto"
    """Data-parallel degree; tp x pp x dp = nodes x per_node."""
    zero: ZeroStage | Auto = "auto"
    """ZeRO stage of data parallelism: 0 = DDP, 1 = sharded optimizer, 2 = + sharded gradients,
    3 = + sharded parameters (FSDP)."""
    recompute: Recompute | Auto = "auto"
    """Activation recomputation: none, selective (recompute cheap ops), or full (per block)."""
    schedule: Schedule | Auto = "auto"
    """Pipeline schedule: gpipe, 1f1b, interleaved (1F1B with virtual stages), zero-bubble."""
    virtual_stages: PositiveIntOrAuto = "auto"
    """Model chunks per pipeline rank for the interleaved schedule (v); 1 otherwise."""
    sequence_parallel: Flag | Auto = "auto"
    """Shard norms and dropout along the sequence over the tensor-parallel group."""
    shard_group: PositiveInt | Auto | None = None
    """Hybrid sharding (HSDP) with ZeRO-2/3: data-parallel ranks per shard group (typically one
    node); parameters, gradients and optimizer state are sharded inside a group and replicated
    across the dp / shard_group groups. A number must divide dp and be less than it, and needs dp
    and zero fixed and tp = pp = 1. ``auto``: the planner weighs plain ZeRO-3 against one node per
    shard group (where tp = pp = 1 and dp spans whole nodes). Unset: the same as ``auto`` when dp or
    zero is left to the planner; plain FSDP (shard over all dp ranks) when both are fixed."""
    tolerance: Annotated[float, Field(ge=0, lt=1)] | Auto = "auto"
    """The planner picks the simplest layout within this fraction of the best throughput (auto: the
    cost model's measured uncertainty, and at least 5 ms per step; docs/planner.md)."""


class Layout(SpecModel):
    """A concrete layout: every ``auto`` resolved. The planner produces it; codegen consumes it."""

    tp: PositiveInt
    """Tensor-parallel degree."""
    pp: PositiveInt
    """Pipeline-parallel degree."""
    dp: PositiveInt
    """Data-parallel degree."""
    zero: ZeroStage
    """ZeRO stage (0 = DDP when dp > 1)."""
    recompute: Recompute
    """Activation recomputation."""
    schedule: Schedule | None
    """Pipeline schedule, None when pp == 1."""
    micro_batch: PositiveInt
    """Sequences per micro-batch per data-parallel rank."""
    virtual_stages: PositiveInt = 1
    """Model chunks per pipeline rank (> 1 only for the interleaved schedule)."""
    sequence_parallel: bool = False
    """Sequence parallelism over the TP group (only when tp > 1)."""
    shard_group: PositiveInt | None = None
    """HSDP: ZeRO-2/3 shards over groups of this many dp ranks and replicates across
    ``dp // shard_group`` groups; None shards over all dp ranks (plain FSDP)."""

    @model_validator(mode="after")
    def _consistent(self) -> Layout:
        problem = resolved_layout(self.tp, self.pp, self.schedule, self.virtual_stages, self.sequence_parallel)
        if problem is not None:
            raise ValueError(problem.message)
        problem = hybrid_shard_group(self.shard_group, self.dp, self.zero, self.tp, self.pp)
        if problem is not None:
            raise ValueError(problem.message)
        return self

    @property
    def replicate_groups(self) -> int:
        """HSDP: how many replicas of the sharded model states (1 without a shard group)."""
        return self.dp // self.shard_group if self.shard_group else 1

    @property
    def shard_degree(self) -> int:
        """Ranks the ZeRO-sharded states are divided over: the shard group, else all of dp."""
        return self.shard_group or self.dp

    @property
    def dims(self):
        """The :class:`~planc.spec.parallel_dims.ParallelDims` of this layout."""
        from planc.spec.parallel_dims import ParallelDims

        return ParallelDims(tp=self.tp, pp=self.pp, dp=self.dp, world_size=self.tp * self.pp * self.dp)

    def grad_accumulation(self, global_batch: int) -> int:
        """Micro-batches per optimizer step on one data-parallel rank."""
        return micro_batches(global_batch, self.dp, self.micro_batch)

    def describe(self) -> str:
        """One line, e.g. ``TP 8 x PP 8 x DP 16 · ZeRO-1 · interleaved (v=4) · mb 1 · full recompute``."""
        parts = [f"TP {self.tp} × PP {self.pp} × DP {self.dp}"]
        if self.dp > 1:
            parts.append({0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3/FSDP"}[self.zero])
            if self.shard_group:
                parts.append(f"HSDP: shard in groups of {self.shard_group}, replicate ×{self.replicate_groups}")
        if self.pp > 1 and self.schedule is not None:
            parts.append(self.schedule + (f" (v={self.virtual_stages})" if self.virtual_stages > 1 else ""))
        parts.append(f"micro-batch {self.micro_batch}")
        if self.recompute != "none":
            parts.append(f"{self.recompute} recompute")
        if self.sequence_parallel:
            parts.append("sequence parallel")
        return " · ".join(parts)
