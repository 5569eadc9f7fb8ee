"""What to measure: GEMM and attention shapes and collective sizes, from a plan or a default set.

With a plan, the shapes are those the cost model will price for it (:func:`planc.cost.compute.block_gemms`
and the head) at every tensor-parallel degree and micro-batch the planner may choose (the plan's
own when it fixes them), and the message sizes span the plan's smallest and largest collective:
a TP activation of one micro-batch, a pipeline boundary, one block's parameters (FSDP's gather),
and the whole model's gradients in DDP buckets of 25 MiB (``torch.nn.parallel.DistributedDataParallel``'s
default ``bucket_cap_mb``). Imports no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planc.cost.compute import block_gemms
from planc.spec.plan import Plan

#: Square-ish GEMMs measured without a plan: the hidden sizes of common models at 2048 tokens.
DEFAULT_GEMMS = tuple((2048, h, h) for h in (256, 512, 1024, 2048, 4096, 8192))
#: (batch, heads, seq_len, head_dim) of the attention measured without a plan.
DEFAULT_ATTENTION = ((1, 16, 1024, 64), (1, 16, 2048, 128), (1, 32, 4096, 128))
#: DDP's default gradient bucket (``bucket_cap_mb=25``).
DDP_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class Workload:
    """The shapes and sizes one calibration measures."""

    gemms: tuple[tuple[int, int, int], ...]
    attention: tuple[tuple[int, int, int, int], ...]
    dtypes: tuple[str, ...]
    message_bytes: tuple[int, ...]


def default_workload(quick: bool, cpu: bool) -> Workload:
    gemms = DEFAULT_GEMMS[:3] if quick or cpu else DEFAULT_GEMMS
    attention = DEFAULT_ATTENTION[:1] if quick or cpu else DEFAULT_ATTENTION
    largest = 64 * 2**20 if cpu else 1024 * 2**20
    return Workload(
        gemms=gemms,
        attention=attention,
        dtypes=("fp32",) if cpu else ("bf16",),
        message_bytes=geometric_sizes(4096, largest // (16 if quick else 1)),
    )


def plan_workload(plan: Plan, quick: bool) -> Workload:
    """The shapes ``plan`` is priced at, for every TP degree and micro-batch it may use."""
    model, layout = plan.model, plan.layout
    tps = [layout.tp] if isinstance(layout.tp, int) else tp_candidates(model.heads, plan.hardware.per_node)
    fixed = layout_micro_batch(plan)
    batches = [fixed] if fixed is not None else micro_batch_candidates(plan)
    if quick:
        tps, batches = tps[:1], batches[:1]
    gemms: set[tuple[int, int, int]] = set()
    attention: set[tuple[int, int, int, int]] = set()
    for tp in tps:
        for b in batches:
            tokens = model.seq_len * b
            gemms.update(block_gemms(model, tokens, tp))
            gemms.add((tokens, model.hidden, model.padded_vocab // tp))
            attention.add((b, max(1, model.heads // tp), model.seq_len, model.head_dim))
    elem = 2 if plan.train.precision == "bf16" else 4
    block_bytes = model.params_per_layer * elem
    activation = model.seq_len * min(batches) * model.hidden * elem
    largest = max(block_bytes, activation * max(batches), min(DDP_BUCKET_BYTES, model.params * 4))
    smallest = max(1024, activation // max(tps))
    return Workload(
        gemms=tuple(sorted(gemms)),
        attention=tuple(sorted(attention)),
        dtypes=(plan.train.precision,),
        message_bytes=geometric_sizes(min(smallest, 4096), largest // (16 if quick else 1)),
    )


def layout_micro_batch(plan: Plan) -> int | None:
    value = plan.train.micro_batch
    return value if isinstance(value, int) else None


def tp_candidates(heads: int, per_node: int) -> list[int]:
    """Powers of two that divide the heads and fit in a node (TP stays inside a node)."""
    return [t for t in (1, 2, 4, 8) if t <= per_node and heads % t == 0]


def micro_batch_candidates(plan: Plan) -> list[int]:
    return [b for b in (1, 2, 4, 8) if plan.train.global_batch % b == 0] or [1]


def geometric_sizes(smallest: int, largest: int, per_octave: float = 0.5) -> tuple[int, ...]:
    """Sizes from ``smallest`` to ``largest`` bytes, one every 1 / per_octave doublings, multiples of 1 KiB."""
    largest = max(largest, smallest)
    steps = max(1, math.ceil(math.log2(largest / smallest) * per_octave))
    sizes = {int(round(smallest * (largest / smallest) ** (i / steps) / 1024)) * 1024 for i in range(steps + 1)}
    return tuple(sorted(s for s in sizes if s > 0))
