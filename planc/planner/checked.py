"""Whether a layout lies where the cost model has been checked against published runs.

Sharded data parallelism (ZeRO-2/3, FSDP, HSDP) is the one family whose published check stops
short of what the planner can be asked for: the model has been held against FSDP programs up to
some number of shard ranks (``sharded_dp`` in ``planc/cost/accuracy.json``, written by
``bench/accuracy.py --write-stats``), and the one measurement beyond (DeepSpeed's ZeRO-3 of 2021
at 384-1536 ranks) ran 1.4-3.6x slower than this model predicts (docs/accuracy.md). A layout that
shards over more ranks than every checked run is *unchecked*: the planner takes one only when no
checked layout fits, and ``planc explain`` says so either way.

The regime of a layout is read off its own estimate (shard ranks, and the data-parallel
communication's total time over the compute time, which explain quotes), the same way for the
published runs (the bench calls :func:`sharded_regime`) and for the planner's candidates.
"""

from __future__ import annotations

from planc.cost.estimate import Estimate
from planc.cost.uncertainty import CheckedRun, sharded_dp_checked_by, sharded_dp_frontier
from planc.spec.layout import Layout
from planc.spec.plan import Plan


def sharded_regime(layout: Layout, estimate: Estimate) -> tuple[int, float] | None:
    """(shard ranks, data-parallel traffic / compute) of a sharded data-parallel layout; None for
    layouts that do not shard parameters or gradients over more than one rank (DDP, ZeRO-1)."""
    if layout.zero < 2 or layout.shard_degree <= 1:
        return None
    dp_seconds = sum(c.total for c in estimate.comm if c.group == "dp")
    ratio = dp_seconds / estimate.compute if estimate.compute > 0 else float("inf")
    return layout.shard_degree, ratio


def unchecked(plan: Plan, layout: Layout, estimate: Estimate) -> bool:
    """True when ``layout`` shards data parallelism past every checked published run. CPU plans
    are never flagged: the published runs are GPU programs, and the CPU matrix is their check."""
    if plan.hardware.is_cpu:
        return False
    regime = sharded_regime(layout, estimate)
    return regime is not None and sharded_dp_checked_by(regime[0]) is None


def widest_checked() -> CheckedRun | None:
    """The checked run with the most ranks (what explain's note quotes)."""
    runs = sharded_dp_frontier()
    return max(runs, key=lambda r: (r.shard_ranks, r.traffic_ratio)) if runs else None
