"""The plan-time cost pass of ``ddp`` (pure; no torch)."""

from __future__ import annotations

from planc.cost.context import CostContext
from planc.cost.data_parallel import bucket_bytes, bucket_terms, by_pp_rank, grad_all_reduce, with_contention
from planc.cost.estimate import CommCost, Estimate, StageMemory, Term
from planc.cost.memory import bf16_weights, fsdp_gather_bytes
from planc.cost.wrappers import ddp_seconds, replicate_seconds, with_dtensor_optimizer, with_wrapper_time
from planc.units import format_bytes

#: Bytes per parameter that FSDP2's ``replicate`` moves outside the GEMMs per micro-batch under
#: bf16 (the same machinery as ``fully_shard``, on a shard of the whole parameter): the fp32 -> bf16
#: cast into the all-gather input (read 4, write 2), the copy out of the (one-rank) all-gather
#: buffer (read 2, write 2), and the bf16 gradient cast to the fp32 ``reduce_dtype`` (read 2, write 4).
REPLICATE_BYTES_PER_PARAM = 6 + 4 + 6

#: Said when a plan sets ``use ddp { bucket }`` where ``replicate`` runs: it has no buckets.
BUCKET_IGNORED = (
    "use ddp { bucket } has no effect here: with precision = bf16, data parallelism runs FSDP2's "
    "replicate, which all-reduces each block's gradients as one message; set bf16_weights = false "
    "in the same block for DistributedDataParallel's buckets (fp32 weights under autocast, slower)"
)


def cost(ctx: CostContext, est: Estimate, options: object = None) -> Estimate:
    """Data parallelism: all-reduce of the fp32 gradients, 2 Psi (ZeRO paper Sec. 7.1).

    fp32: ``DistributedDataParallel`` with its buckets. bf16: ``replicate`` (FSDP2), one all-reduce
    per unit (each block, the root) once per step, overlapping backward as DDP's buckets do; the
    bf16 compute copies are model states (``runtime_state_bytes``); transient, one unit's bf16
    gradients and their fp32 copy; the casts cost :data:`REPLICATE_BYTES_PER_PARAM` of memory
    traffic per micro-batch."""
    lay = ctx.layout
    if lay.dp == 1:
        return est
    link = ctx.links["dp"]
    # planc's program; another runtime's profile (Megatron-LM's DDP over bf16 parameters) keeps DDP's buckets.
    replicated = ctx.profile.torch_data_parallel and bf16_weights(
        ctx.plan.train.precision, lay.zero, lay.dp, getattr(options, "bf16_weights", True)
    )
    if replicated:
        units = max(st.layers + st.embedding + st.head for st in ctx.stages)
        psi = max(st.params for st in ctx.stages)
        nbytes, seconds, exposed = grad_all_reduce(ctx, ctx.grad_reduce_bytes * psi / units)
        detail = f"all-reduce of {format_bytes(nbytes)} fp32 gradients, one per block (replicate)"

        def transient(s: StageMemory) -> tuple[Term, ...]:
            st = ctx.stage(s.rank)
            _, unit = fsdp_gather_bytes(st.largest_unit, 0, 0, 2, ctx.compute_bytes, ctx.grad_reduce_bytes)
            return (Term("replicate: one block's bf16 gradients and their fp32 copy", unit),)

        held_throughout = False
        casts = ctx.micro_batches * REPLICATE_BYTES_PER_PARAM * psi / ctx.device.memory_rate
        wrapper = ("replicate hooks and copies (measured)", replicate_seconds(ctx, units))
    else:
        nbytes, seconds, exposed = grad_all_reduce(ctx, bucket_bytes(options))
        detail = f"all-reduce of {format_bytes(nbytes)} fp32 gradients"

        def transient(s: StageMemory) -> tuple[Term, ...]:
            return bucket_terms(ctx, s.rank)

        # The gradients are views into DDP's buckets (gradient_as_bucket_view), which exist from
        # the wrapper's construction on: held before the first backward too.
        held_throughout = True

        casts = 0.0
        wrapper = ("DDP hooks and buckets (measured)", ddp_seconds(ctx))
    volume = 2 * (lay.dp - 1) / lay.dp * nbytes
    comm = CommCost(
        "dp",
        volume=volume,
        volume_by_pp_rank=by_pp_rank(ctx, volume),
        total=seconds,
        exposed=exposed,
        medium=link.medium,
        detail=detail,
    )

    def stage_fn(s: StageMemory) -> StageMemory:
        s = s.updated(transient=transient(s))
        return s.updated(first_backward_frees=0.0, stages_without_grads=0, absent_grads=0.0) if held_throughout else s

    est = est.updated(stage_fn=stage_fn, comm=comm, compute=est.compute + casts)
    if replicated and "bucket" in getattr(options, "model_fields_set", ()):
        est = est.with_note(BUCKET_IGNORED)
    # replicate's hooks run in every micro-batch; DDP's reducer only in the one that syncs
    est = with_wrapper_time(est, *wrapper, per_micro_batch=replicated)
    if replicated:  # replicate's parameters are DTensors (replicated over the data-parallel mesh)
        est = with_dtensor_optimizer(est, ctx)
    return with_contention(ctx, est, seconds - exposed)
