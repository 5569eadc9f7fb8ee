"""The plan-time cost pass of ``tensor_parallel`` (pure; no torch)."""

from __future__ import annotations

from planc.cost.comm import all_gather_seconds, all_reduce_seconds, norm_reductions, reduce_scatter_seconds
from planc.cost.context import CostContext
from planc.cost.estimate import CommCost, Estimate, StageMemory, Term
from planc.cost.params import StageParams, whole_embedding_gradient_rows
from planc.cost.wrappers import tp_seconds, with_dtensor_optimizer, with_wrapper_time
from planc.strategies.bf16.cost_pass import block_copy_bytes
from planc.units import format_bytes


def tp_block_collectives(ctx: CostContext) -> tuple[float, float, float]:
    """(forward seconds, backward seconds, bytes sent) of one block's TP collectives, one micro-batch.

    Two sub-layers (attention, MLP), each one collective forward and one backward
    (Shoeybi et al. 2019, Fig. 3: the f and g operators). Without SP: the forward all-reduces
    the row-parallel output (e bytes per element), the backward all-reduces the gradient of the
    replicated input (r bytes: fp32 under autocast, whose input is the fp32 residual stream).
    With SP (Korthikanti et al. 2022, Sec. 4.2.2): forward all-gather of the input (r) and
    reduce-scatter of the output (e); backward the reverse pair; same bytes in all.
    """
    link = ctx.links["tp"]
    t = ctx.layout.tp
    elements = ctx.tokens_per_microbatch * ctx.model.hidden
    e, r = ctx.compute_bytes * elements, ctx.residual_bytes * elements
    if ctx.layout.sequence_parallel:
        fwd = 2 * (all_gather_seconds(r, link) + reduce_scatter_seconds(e, link))
        bwd = 2 * (reduce_scatter_seconds(r, link) + all_gather_seconds(e, link))
        sent = 4 * (e + r) * (t - 1) / t
    else:
        fwd, bwd = 2 * all_reduce_seconds(e, link), 2 * all_reduce_seconds(r, link)
        sent = 4 * (e + r) * (t - 1) / t
    return fwd, bwd, sent


def last_forward_collective(ctx: CostContext) -> tuple[float, float]:
    """(seconds, bytes sent) of a block's last forward TP collective, one micro-batch: the MLP's
    output reduce-scatter under SP, its all-reduce without (:func:`tp_block_collectives`)."""
    link, t = ctx.links["tp"], ctx.layout.tp
    e = ctx.compute_bytes * ctx.tokens_per_microbatch * ctx.model.hidden
    if ctx.layout.sequence_parallel:
        return reduce_scatter_seconds(e, link), e * (t - 1) / t
    return all_reduce_seconds(e, link), 2 * e * (t - 1) / t


def sp_norm_gradient_bytes(ctx: CostContext) -> float:
    """Bytes of the norms' gradients a rank sums over tp once per step under sequence parallelism
    (0 without): each norm's replicated gain (and bias) sees only its rank's sequence shard, so its
    gradient is a partial sum. planc's step sums them all in one all-reduce before clipping
    (:func:`planc.runtime.optim.reduce_partial_gradients`; under DDP
    :func:`planc.runtime.optim.sum_in_place` on DDP's local shards), as Megatron-LM's
    ``_allreduce_layernorm_grads`` does; under FSDP2 they are summed tensor by tensor before its
    reduce-scatter, whose extra start-ups this leaves out. The busiest pipeline rank's: two norms
    per block and the final norm."""
    lay = ctx.layout
    if not lay.sequence_parallel or lay.tp == 1:
        return 0.0
    model = ctx.model
    per_norm = model.hidden * (2 if model.norm == "layernorm" and model.bias else 1)
    norms = max(2 * st.layers + st.head for st in ctx.stages)
    return float(norms * per_norm * ctx.grad_reduce_bytes)


def sp_regather(ctx: CostContext) -> tuple[float, float]:
    """(seconds, bytes sent) per block and micro-batch of the all-gathers that selective
    recomputation reruns in backward under SP: the inputs of the attention and MLP sub-layers
    (r bytes per element, as in the forward), gathered again rather than kept (Korthikanti et
    al. 2022, Sec. 4.2.2: "we only store the Y_i^s part ... and perform an extra all-gather in
    the backward pass"). Zero without SP, and in a program that keeps the shard in every mode
    (``profile.sp_saves_gathered_input`` false: Megatron), which issues that all-gather
    asynchronously behind the input-gradient GEMM of its column-parallel linear (Megatron-LM
    ``LinearWithGradAccumulationAndAsyncCommunication.backward``): hidden there, and not
    specific to recomputation."""
    if not ctx.layout.sequence_parallel or ctx.layout.tp == 1 or not ctx.profile.sp_saves_gathered_input:
        return 0.0, 0.0
    t = ctx.layout.tp
    r = ctx.residual_bytes * ctx.tokens_per_microbatch * ctx.model.hidden
    return 2 * all_gather_seconds(r, ctx.links["tp"]), 2 * r * (t - 1) / t


def cost(ctx: CostContext, est: Estimate, options: object = None) -> Estimate:
    """Tensor parallelism (Shoeybi et al. 2019, Sec. 3; Narayanan et al. 2021, Sec. 3.2).

    Per block and micro-batch: :func:`tp_block_collectives` (4 collectives, the "4 all-reduces
    per layer" of Narayanan et al.). The vocab-parallel embedding all-reduces (SP:
    reduce-scatters) its output on the first stage; the head gathers its input under SP, or
    all-reduces its input gradient without. Not overlapped with compute in eager PyTorch: all
    exposed.
    """
    lay = ctx.layout
    t = lay.tp
    if t == 1:
        return est
    link = ctx.links["tp"]
    m = ctx.micro_batches
    fwd, bwd, sent = tp_block_collectives(ctx)
    layers = max(st.layers for st in ctx.stages)
    edges, edge_volume = _edge_collectives(ctx)
    # The gradient norm: one all-reduce per kind of sharded gradient (column-parallel Shard(0),
    # row-parallel Shard(1); the replicated norms need none), waited on before clipping.
    norm_seconds, norm_volume = norm_reductions(2, link)
    gains = sp_norm_gradient_bytes(ctx)
    gains_seconds = all_reduce_seconds(gains, link)
    total = m * (layers * (fwd + bwd) + edges) + norm_seconds + gains_seconds
    each_step = norm_volume + 2 * (t - 1) / t * gains
    volume = m * (layers * sent + edge_volume) + each_step
    by_rank = tuple(m * (st.layers * sent + _edge_of_stage(ctx, st)[1]) + each_step for st in ctx.stages_by_pp_rank)
    kind = "all-gather/reduce-scatter pairs" if lay.sequence_parallel else "all-reduces"
    one = ctx.compute_bytes * ctx.tokens_per_microbatch * ctx.model.hidden  # bytes of one collective's activation
    dtype = "bf16" if ctx.compute_bytes == 2 else "fp32"  # the activations' dtype, as the size counts them
    comm = CommCost(
        "tp",
        volume=volume,
        volume_by_pp_rank=by_rank,
        total=total,
        exposed=total,
        medium=link.medium,
        detail=f"4 activation {kind} per block per micro-batch ({format_bytes(one)} in {dtype}), "
        "2 all-reduces of the gradient norm"
        + (f", 1 of the norms' {format_bytes(gains)} of gradients" if gains else ""),
    )
    dispatch = with_wrapper_time(est, "DTensor dispatch (measured)", tp_seconds(ctx), per_micro_batch=True)
    est = with_dtensor_optimizer(dispatch, ctx)
    return est.updated(comm=comm, stage_fn=lambda s: _replicated_embedding_grad(ctx, s))


def _edge_collectives(ctx: CostContext) -> tuple[float, float]:
    """(seconds, bytes sent) per micro-batch of the collectives outside the blocks, on the
    pipeline rank with the most of them (counted by ``planc verify``'s collective counter).

    Without SP: the vocab-parallel embedding all-reduces its output (forward) and the head's
    replicated input gets its gradient all-reduced (backward): an all-reduce of the residual
    stream each. With SP: the embedding reduce-scatters its output and all-gathers that
    gradient, the head all-gathers its input and reduce-scatters that gradient, and a learned
    position table (s x h, replicated) is all-gathered once more for the sequence shards. Under
    pipelining a rank holds the embedding, the head or (ZBV's rank 0, or pp = 1) both.
    """
    return max((_edge_of_stage(ctx, st) for st in ctx.stages), default=(0.0, 0.0))


def _edge_of_stage(ctx: CostContext, st: StageParams) -> tuple[float, float]:
    """(seconds, bytes sent) per micro-batch of stage ``st``'s collectives outside its blocks."""
    link, t = ctx.links["tp"], ctx.layout.tp
    edge = ctx.residual_bytes * ctx.tokens_per_microbatch * ctx.model.hidden
    if ctx.layout.sequence_parallel:
        seconds = (st.embedding + st.head) * (reduce_scatter_seconds(edge, link) + all_gather_seconds(edge, link))
        sent = (st.embedding + st.head) * 2 * edge * (t - 1) / t
        if st.embedding and ctx.model.position == "learned":
            table = ctx.residual_bytes * ctx.model.seq_len * ctx.model.hidden
            seconds += all_gather_seconds(table, link)
            sent += table * (t - 1) / t
        return seconds, sent
    seconds = (st.embedding + st.head) * all_reduce_seconds(edge, link)
    return seconds, (st.embedding + st.head) * 2 * edge * (t - 1) / t


def _replicated_embedding_grad(ctx: CostContext, s: StageMemory) -> StageMemory:
    """The vocab-parallel embedding's gradient comes out of backward whole
    (:func:`~planc.cost.params.whole_embedding_gradient_rows`). Without data parallelism every TP
    rank holds the whole [V, h] gradient until ``zero_grad``, not its 1/t rows (measured by ``planc
    verify``: torch 2.13, tp = 2); under DistributedDataParallel (fp32 DDP, ZeRO-1) with its local
    rows beside it, until the reducer copies them into the bucket (simulated). Under FSDP (ZeRO-2/3)
    the ``fsdp`` pass prices it, with the gradients FSDP accumulates
    (:func:`planc.strategies.fsdp.cost_pass.whole_embedding_gradient`)."""
    lay = ctx.layout
    st = ctx.stage(s.rank)
    if not st.embedding:
        return s
    rows = whole_embedding_gradient_rows(ctx.model, lay.tp)
    if lay.dp == 1:
        whole = ctx.state_bytes.grads * rows * ctx.model.hidden
        # absent at the peak where the embedding's stage has not run a backward yet (interleaved)
        absent = s.absent_grads + (whole if s.stages_without_grads else 0.0)
        return s.updated(grads=s.grads + whole, absent_grads=absent)
    if lay.zero >= 2 or ctx.state_bytes.master or not ctx.profile.torch_data_parallel:
        return s  # FSDP's pass prices it; bf16 DDP is FSDP2's replicate: simulated, its peak is elsewhere
    # DistributedDataParallel (fp32 DDP, ZeRO-1) over local shards: at the end of backward the
    # whole-vocabulary gradient and this rank's rows of it, before the reducer copies them into
    # its bucket, in the fp32 of the parameters (autocast leaves the embedding in fp32).
    # Simulated, tiny model at TP 2: 4 + 2 MiB for an [8192, 128] table (docs/verify.md).
    vocab = ctx.model.padded_vocab
    # The finished micro-batch's activations on this chunk are gone by then, and autocast's weight
    # copies of its blocks with them (none were kept under recomputation).
    copies = block_copy_bytes(ctx) * st.layers / lay.virtual_stages if lay.recompute == "none" else 0.0
    gone = ctx.chunk_activations(st) + copies + ctx.freed_before_the_embedding_backward(st, s.act_layers)
    held = ctx.state_bytes.grads * (vocab + vocab // lay.tp) * ctx.model.hidden - gone
    if held <= 0:
        return s
    name = "embedding gradient over the whole vocabulary and its local rows (DDP), beyond what backward freed"
    return s.updated(transient=(Term(name, held, "embedding"),))
