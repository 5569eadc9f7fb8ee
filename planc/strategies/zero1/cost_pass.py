"""The plan-time cost pass of ``zero1`` (pure; no torch)."""

from __future__ import annotations

from planc.cost.comm import all_gather_seconds, broadcasts_seconds
from planc.cost.context import CostContext
from planc.cost.data_parallel import bucket_bytes, bucket_terms, grad_all_reduce, shard_states, with_contention
from planc.cost.estimate import CommCost, Estimate, StageMemory
from planc.cost.wrappers import ddp_seconds, tensors_per_rank, with_wrapper_time
from planc.cost.zero_partition import partitioned_by_tensor, with_zero1_share, zero1_state_elements


def cost(ctx: CostContext, est: Estimate, options: object = None) -> Estimate:
    """ZeRO-1 as torch runs it: DDP's all-reduce, then ``ZeroRedundancyOptimizer`` steps its
    1/N_d shard of the optimizer states and broadcasts the updated parameters (an all-gather
    of Psi fp32 values), after the step and before the next forward: fully exposed. Volume
    2 Psi + Psi, where DeepSpeed's reduce-scatter + all-gather would move 2 Psi (ZeRO Sec. 7.2).

    planc's program builds ``ZeroRedundancyOptimizer`` with torch's default
    ``parameters_as_bucket_view=False``, and ``_sync_params`` then broadcasts parameter by
    parameter (torch/distributed/optim/zero_redundancy_optimizer.py, ``_broadcast_params_from_rank``):
    one broadcast's latency per parameter tensor, not one all-gather's. Another runtime's
    profile (Megatron-Core's bucketed distributed optimizer) keeps the all-gather.

    Memory: ``ZeroRedundancyOptimizer`` gives each parameter tensor whole to one rank
    (:mod:`planc.cost.zero_partition`); a stage's optimizer states are its most loaded rank's,
    not Psi / N_d (Megatron-Core's flat buffer is cut evenly: Psi / N_d there)."""
    lay = ctx.layout
    if lay.dp == 1:
        return est
    link = ctx.links["dp"]
    nbytes, seconds, exposed = grad_all_reduce(ctx, bucket_bytes(options))
    params = ctx.state_bytes.working * max(st.params for st in ctx.stages)
    if ctx.profile.torch_data_parallel:  # torch's ZeroRedundancyOptimizer
        gather = broadcasts_seconds(tensors_per_rank(ctx), params, link)
        detail = "all-reduce of gradients + broadcast of updated parameters, one per tensor"
    else:
        gather = all_gather_seconds(params, link)
        detail = "all-reduce of gradients + all-gather of updated parameters"
    frac = (lay.dp - 1) / lay.dp
    comm = CommCost(
        "dp",
        volume=frac * (2 * nbytes + params),
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
