"""What every data-parallel cost pass shares: the bucketed gradient all-reduce, ZeRO's sharding of
the model states, and the compute that overlapped traffic takes away.

Used by the built-in ``ddp``, ``zero1`` and ``fsdp`` passes; a plugin that changes data
parallelism (a compression hook, an offload) may use them too. Pure functions of the
:class:`~planc.cost.context.CostContext`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from planc.cost.comm import all_reduce_seconds
from planc.cost.compute import overlap_contention
from planc.cost.context import CostContext
from planc.cost.estimate import CommCost, Estimate, StageMemory, Term
from planc.cost.memory import DDP_BUCKET_BYTES, model_state_bytes


def bucket_bytes(options: object) -> float:
    """The ``bucket`` option of ``ddp`` / ``zero1`` (25 MB when absent)."""
    return float(getattr(options, "bucket", None) or DDP_BUCKET_BYTES)


def grad_all_reduce(ctx: CostContext, bucket: float = DDP_BUCKET_BYTES) -> tuple[float, float, float]:
    """(bytes, seconds, exposed seconds) of the gradient all-reduce of the largest rank.

    DDP reduces 25 MB buckets as their gradients become ready during the last micro-batch's
    backward (Li et al. 2020, PyTorch Distributed, Sec. 3.2.3): what does not fit behind that
    backward is exposed, and at least the last bucket always is.
    """
    link = ctx.links["dp"]
    nbytes = ctx.grad_reduce_bytes * max(st.params for st in ctx.stages)
    buckets = max(1, math.ceil(nbytes / bucket))
    seconds = buckets * all_reduce_seconds(nbytes / buckets, link)  # each bucket pays the latency
    if not ctx.profile.dp_overlap:
        return nbytes, seconds, seconds
    last_bucket = all_reduce_seconds(nbytes / buckets, link)
    return nbytes, seconds, max(seconds - ctx.slowest.backward, last_bucket)


def bucket_terms(ctx: CostContext, rank: int) -> tuple[Term, ...]:
    """DDP's reducer keeps every gradient in a flat bucket buffer besides ``param.grad`` (the
    default ``gradient_as_bucket_view=False``: "the saved memory size will be equal to the
    total gradients size" when set, PyTorch DDP docs)."""
    if not ctx.profile.ddp_bucket_copy:
        return ()
    return (
        Term("DDP gradient buckets (a flat copy of every gradient)", ctx.grad_reduce_bytes * ctx.stage(rank).params),
    )


#: The step-time term of :func:`with_contention` (a pass that shrinks the traffic scales it).
CONTENTION = "compute slowed by overlapped DP traffic"


def with_contention(ctx: CostContext, est: Estimate, hidden: float) -> Estimate:
    """Charge the compute that overlapped data-parallel traffic takes away
    (:func:`planc.cost.compute.overlap_contention`)."""
    extra = hidden * overlap_contention(ctx.device)
    return est.with_time(CONTENTION, extra) if extra > 0 else est


def shard_states(
    ctx: CostContext,
    est: Estimate,
    zero: int,
    buffers: Callable[[StageMemory], tuple[Term, ...]],
    comm: CommCost,
) -> Estimate:
    """Shard the model states over the dp ranks (ZeRO stage ``zero``), add ``buffers(stage)``
    and the data-parallel traffic ``comm``. With HSDP the states are sharded over the shard group
    only (each replica holds a full set)."""
    n_d = ctx.layout.shard_degree

    def shard(s: StageMemory) -> StageMemory:
        states = model_state_bytes(ctx.stage(s.rank).params, n_d, zero, ctx.state_bytes)
        return s.updated(
            params=states.params,
            master=states.master,
            grads=states.grads,
            optimizer=states.optimizer,
            transient=buffers(s),
            # FSDP's gradients are priced by its own buffer terms (unsharded, accumulated, root
            # unit), whose lifetimes its cost pass models: held throughout here, as before.
            first_backward_frees=0.0,
        )

    return est.updated(stage_fn=shard, comm=comm, optimizer=est.optimizer / n_d)
