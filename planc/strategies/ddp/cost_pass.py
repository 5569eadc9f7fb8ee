"""The plan-time cost pass of ``ddp`` (pure; no torch)."""

from __future__ import annotations

from planc.cost.context import CostContext
from planc.cost.data_parallel import bucket_bytes, bucket_terms, grad_all_reduce, with_contention
from planc.cost.estimate import CommCost, Estimate


def cost(ctx: CostContext, est: Estimate, options: object = None) -> Estimate:
    """DistributedDataParallel: all-reduce of the fp32 gradients, 2 Psi (ZeRO paper Sec. 7.1)."""
    lay = ctx.layout
    if lay.dp == 1:
        return est
    link = ctx.links["dp"]
    nbytes, seconds, exposed = grad_all_reduce(ctx, bucket_bytes(options))
    comm = CommCost(
        "dp",
        volume=2 * (lay.dp - 1) / lay.dp * nbytes,
        total=seconds,
        exposed=exposed,
        medium=link.medium,
        detail=f"all-reduce of {nbytes / 2**30:.2f} GiB fp32 gradients",
    )
    est = est.updated(stage_fn=lambda s: s.updated(transient=bucket_terms(ctx, s.rank)), comm=comm)
    return with_contention(ctx, est, seconds - exposed)
