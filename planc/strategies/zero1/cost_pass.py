"""The plan-time cost pass of ``zero1`` (pure; no torch)."""

from __future__ import annotations

import math

from planc.cost.comm import all_gather_seconds, broadcasts_seconds, reduce_scatter_seconds
from planc.cost.context import CostContext
from planc.cost.data_parallel import (
    bucket_bytes,
    bucket_terms,
    by_pp_rank,
    grad_all_reduce,
    shard_states,
    with_contention,
)
from planc.cost.estimate import CommCost, Estimate, StageMemory
from planc.cost.wrappers import ddp_seconds, with_wrapper_time
from planc.cost.zero_partition import partitioned_by_tensor, with_zero1_share, zero1_state_elements


def cost(ctx: CostContext, est: Estimate, options: object = None) -> Estimate:
    """ZeRO-1 as torch runs it: DDP's all-reduce, then ``ZeroRedundancyOptimizer`` steps its
    1/N_d shard of the optimizer states and broadcasts the updated parameters (an all-gather
    of Psi fp32 values), after the step and before the next forward: fully exposed. Volume
    2 Psi + Psi, where DeepSpeed's reduce-scatter + all-gather would move 2 Psi (ZeRO Sec. 7.2).

    planc's program builds ``ZeroRedundancyOptimizer`` with ``parameters_as_bucket_view=True``:
    each rank's parameters are views into one flat buffer, and ``_sync_params`` broadcasts each
    rank's buffer from it (torch/distributed/optim/zero_redundancy_optimizer.py,
    ``_broadcast_params_from_rank``): N_d broadcasts, one after another on the group, each a
    broadcast's start-up (torch's default, ``False``, pays one per parameter tensor). Megatron-LM
    2021's profile (MT-NLG's ZeRO-1) keeps an all-reduce and one all-gather, exposed as here; Megatron-Core's
    distributed optimizer reduce-scatters and all-gathers in buckets behind compute
    (:func:`_distributed_optimizer`).

    Memory: ``ZeroRedundancyOptimizer`` gives each parameter tensor whole to one rank
    (:mod:`planc.cost.zero_partition`); a stage's optimizer states are its most loaded rank's,
    not Psi / N_d (Megatron-Core's flat buffer is cut evenly: Psi / N_d there)."""
    lay = ctx.layout
    if lay.dp == 1:
        return est
    if ctx.profile.distributed_optimizer:
        comm, hidden = _distributed_optimizer(ctx)
        return with_contention(ctx, shard_states(ctx, est, 1, lambda s: (), comm), hidden)
    link = ctx.links["dp"]
    nbytes, seconds, exposed = grad_all_reduce(ctx, bucket_bytes(options))
    params = ctx.state_bytes.working * max(st.params for st in ctx.stages)
    if ctx.profile.torch_data_parallel:  # torch's ZeroRedundancyOptimizer
        gather = broadcasts_seconds(lay.dp, params, link)
        detail = "all-reduce of gradients + broadcast of updated parameters, one per rank's buffer"
    else:
        gather = all_gather_seconds(params, link)
        detail = "all-reduce of gradients + all-gather of updated parameters"
    frac = (lay.dp - 1) / lay.dp
    comm = CommCost(
        "dp",
        volume=frac * (2 * nbytes + params),
        volume_by_pp_rank=by_pp_rank(ctx, frac * (2 * nbytes + params)),
        total=seconds + gather,
        exposed=exposed + gather,
        medium=link.medium,
        detail=detail,
    )
    est = shard_states(ctx, est, 1, lambda s: bucket_terms(ctx, s.rank), comm)
    if partitioned_by_tensor(ctx):
        est = est.updated(stage_fn=lambda s: _most_loaded_rank(ctx, s))
    est = with_wrapper_time(est, "DDP hooks and buckets (measured)", ddp_seconds(ctx))
    return with_contention(ctx, est, seconds - exposed)


def _most_loaded_rank(ctx: CostContext, s: StageMemory) -> StageMemory:
    """Stage memory with the master and optimizer states of the data-parallel rank holding most."""
    return with_zero1_share(ctx, s, max(zero1_state_elements(ctx, s.rank)))


def megatron_bucket_params(dp: int) -> int:
    """Parameters per bucket of Megatron-Core's data-parallel buffers when none is given:
    max(40,000,000, 1,000,000 x dp) ("larger DP sizes need larger buckets to ensure collectives do
    not become latency-bound": ``DistributedDataParallelConfig.bucket_size``, Megatron-LM
    megatron/core/distributed/distributed_data_parallel_config.py, core_v0.7.0)."""
    return max(40_000_000, 1_000_000 * dp)


def _distributed_optimizer(ctx: CostContext) -> tuple[CommCost, float]:
    """(traffic, seconds of it hidden behind compute) of Megatron-Core's distributed optimizer
    (:attr:`~planc.cost.profile.RuntimeProfile.distributed_optimizer`) on the most loaded stage.

    Both collectives run per bucket (:func:`megatron_bucket_params`), the gradients in the reduce
    precision (fp32 under bf16: Megatron sets ``accumulate_allreduce_grads_in_fp32`` for bf16), the
    parameters in the working precision:

    - the reduce-scatter of a bucket starts once the last micro-batch's backward has made its
      gradients: what does not fit behind that backward is exposed, and at least the last bucket;
    - the all-gather of a bucket is waited for by the next forward's first module in it: what does
      not fit behind the first micro-batch's forward is exposed, and at least the first bucket.

    Without ``dp_overlap`` both are exposed whole."""
    link = ctx.links["dp"]
    params = max(st.params for st in ctx.stages)
    grads, weights = ctx.grad_reduce_bytes * params, ctx.state_bytes.working * params
    buckets = max(1, math.ceil(params / megatron_bucket_params(ctx.layout.dp)))
    scatter_one = reduce_scatter_seconds(grads / buckets, link)
    gather_one = all_gather_seconds(weights / buckets, link)
    scatter, gather = buckets * scatter_one, buckets * gather_one
    if ctx.profile.dp_overlap:
        exposed = max(scatter - ctx.slowest.backward, scatter_one) + max(gather - ctx.slowest.forward, gather_one)
    else:
        exposed = scatter + gather
    volume = (ctx.layout.dp - 1) / ctx.layout.dp * (grads + weights)
    comm = CommCost(
        "dp",
        volume=volume,
        volume_by_pp_rank=by_pp_rank(ctx, volume),
        total=scatter + gather,
        exposed=exposed,
        medium=link.medium,
        detail="reduce-scatter of gradients behind the backward + all-gather of parameters behind the next forward",
    )
    return comm, scatter + gather - exposed
