"""The built-in strategies' cost passes: pure ``cost(ctx, estimate, options) -> estimate``.

Each strategy module re-exports its pass (``from planc.cost.builtin import ddp as cost``); the
cost model runs them in composition order: pipeline -> tensor_parallel -> recompute -> bf16 ->
ddp / zero1 / fsdp. A pass adds the terms its strategy is responsible for and nothing else:

========== ===================================================================================
pipeline   micro-batches in flight per schedule, receive buffers, bubble, p2p traffic
tensor_parallel  activation all-reduces (or SP all-gather/reduce-scatter) per block
recompute  fewer saved activations, the recomputed forward, its extra TP collectives
bf16       autocast's bf16 copies of fp32 weights
ddp        gradient all-reduce, overlapped with backward through 25 MB buckets
zero1      optimizer states sharded; all-reduce + parameter all-gather after the step
fsdp       ZeRO-2/3: states sharded; per-micro-batch all-gathers and reduce-scatter, prefetched
========== ===================================================================================
"""

from __future__ import annotations

import math

from planc.cost.comm import (
    all_gather_seconds,
    all_reduce_seconds,
    p2p_seconds,
    reduce_scatter_seconds,
)
from planc.cost.compute import overlap_contention
from planc.cost.context import CostContext
from planc.cost.estimate import CommCost, Estimate, StageMemory, Term, replace
from planc.cost.memory import DDP_BUCKET_BYTES, chunks_in_flight, fsdp_gather_bytes, model_state_bytes

# -- pipeline ---------------------------------------------------------------------------------


def pipeline(ctx: CostContext, est: Estimate, options=None) -> Estimate:
    """Pipeline parallelism (Narayanan et al. 2021, Sec. 2.2; Qi et al. 2023 for zero-bubble).

    - **Activations**: rank i holds :func:`~planc.cost.memory.chunks_in_flight` chunk-micro-
      batches of (its layers / v) blocks each.
    - **Receive buffers**: torch's stages allocate an activation buffer (all ranks but the very
      first chunk) and a gradient buffer (all but the very last) for each of the m x v
      chunk-micro-batches; Megatron only for the one in flight.
    - **Bubble** in micro-batch slots (:func:`bubble_slots`): (p - 1) for GPipe and 1F1B,
      (p - 1) / v interleaved (when m >= p);
      zero-bubble (ZB-H1 / ZB1P) (p - 1)(T_F + T_B - T_W) / (v (T_F + T_B + T_W)) — a third
      of 1F1B's when the three passes take equal time (Qi et al. 2023, Sec. 2.1, Fig. 3).
    - **p2p**: each chunk-micro-batch sends its boundary tensor forward and its gradient back:
      2 m v transfers of ``ctx.boundary_bytes``. torch posts them asynchronously: only the
      2 (p v - 1) hops of warm-up and cool-down, and any excess of a transfer over a chunk's
      compute, are exposed; Megatron 2021 waits on each.
    """
    lay = ctx.layout
    p, v, m = lay.pp, lay.virtual_stages, ctx.micro_batches
    if p == 1:
        return est
    prof = ctx.profile
    boundary = ctx.boundary_bytes

    def stage_memory(s: StageMemory) -> StageMemory:
        st = ctx.stage(s.rank)
        chunks = chunks_in_flight(lay.schedule, p, v, m, s.rank)
        if prof.pp_recv_buffers == "per_microbatch":
            buffers = m * (v - (s.rank == 0)) + m * (v - (s.rank == p - 1))
            label = f"pipeline receive buffers ({buffers} = one per chunk-micro-batch)"
        else:
            buffers = (s.rank != 0 or v > 1) + (s.rank != p - 1 or v > 1)
            label = "pipeline send/receive buffers"
        terms = (Term(label, buffers * boundary),) if buffers else ()
        return s.updated(act_layers=chunks * st.layers / v, transient=terms)

    slow = ctx.slowest
    f, b = slow.forward, slow.backward
    slots = bubble_slots(p, v, m)
    if lay.schedule == "zero-bubble":
        slots *= (f + b - slow.backward_weight) / (f + b)

    link = ctx.links["pp_p2p"]
    transfer = p2p_seconds(boundary, link)
    if prof.p2p_scatter_gather and lay.tp > 1 and not lay.sequence_parallel:
        transfer += all_gather_seconds(boundary * lay.tp, ctx.links["tp"])  # re-assemble in the node
    transfers = 2 * m * v
    total = transfers * transfer
    if prof.pp_p2p_blocking:
        exposed = total
    else:
        chunk_slot = min(f, b) / v
        exposed = min(total, 2 * (p * v - 1) * transfer + transfers * max(0.0, transfer - chunk_slot))
    comm = CommCost(
        "pp",
        volume=transfers * boundary,
        total=total,
        exposed=exposed,
        medium=link.medium,
        detail=f"{transfers} p2p transfers of {boundary / 2**20:.1f} MiB per step",
    )
    return est.updated(stage_fn=stage_memory, comm=comm, bubble_slots=est.bubble_slots + slots)


def bubble_slots(p: int, v: int, m: int) -> float:
    """Idle micro-batch slots of a pipeline flush: (p - 1)/v once m >= p (Narayanan et al. 2021,
    Sec. 2.2: bubble fraction (p - 1)/(v m)).

    In chunk time (a slot / v) the step lasts v m + p - 1 chunks when m >= p: the last
    micro-batch leaves p - 1 chunk-hops after the first rank is done. With fewer micro-batches
    than stages a micro-batch's own path (p v chunks) is the critical one: v p + m - 1. Both are
    v max(m, p) + min(m, p) - 1; the bubble is that less the v m chunks of work.
    """
    return (v * max(m, p) + min(m, p) - 1) / v - m


# -- tensor parallel --------------------------------------------------------------------------


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


def tensor_parallel(ctx: CostContext, est: Estimate, options=None) -> Estimate:
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
    edge_bytes = ctx.residual_bytes * ctx.tokens_per_microbatch * ctx.model.hidden
    if lay.sequence_parallel:
        edges = reduce_scatter_seconds(edge_bytes, link) + 2 * all_gather_seconds(edge_bytes, link)
    else:
        edges = 2 * all_reduce_seconds(edge_bytes, link)
    total = m * (layers * (fwd + bwd) + edges)
    volume = m * (layers * sent + 2 * edge_bytes * (t - 1) / t)
    kind = "all-gather/reduce-scatter pairs" if lay.sequence_parallel else "all-reduces"
    mib = ctx.compute_bytes * ctx.tokens_per_microbatch * ctx.model.hidden / 2**20
    comm = CommCost(
        "tp",
        volume=volume,
        total=total,
        exposed=total,
        medium=link.medium,
        detail=f"4 activation {kind} per block per micro-batch ({mib:.0f} MiB in bf16)",
    )
    return est.updated(comm=comm)


# -- activation recomputation ------------------------------------------------------------------


def recompute(ctx: CostContext, est: Estimate, options=None) -> Estimate:
    """Activation recomputation (Chen et al. 2016; Korthikanti et al. 2022, Sec. 4.3, Table 2).

    - selective: blocks keep ``layer_act.selective`` bytes; recomputing costs
      ``layer.selective_recompute`` per block and micro-batch (planc's policy: the elementwise
      kernels and the attention-out GEMM; no communication).
    - full: blocks keep only their input; the backward of each block first reruns its forward
      (one more forward of every block: Narayanan's 4 passes instead of 3), which under TP also
      reruns the forward's two all-reduces; one block's full activations are alive while it is
      recomputed (the working set).
    """
    mode = ctx.layout.recompute
    if mode == "none":
        return est
    m = ctx.micro_batches
    layers = ctx.stage(ctx.slowest.rank).layers
    comm = None
    if mode == "selective":
        per_layer, extra = ctx.layer_act.selective, m * layers * ctx.layer.selective_recompute
        stage_fn = lambda s: replace(s, act_per_layer=per_layer)  # noqa: E731
    else:
        per_layer, extra = ctx.layer_act.full, m * layers * ctx.layer.forward
        working = (Term("recompute working set (one block)", ctx.layer_act.none),)
        stage_fn = lambda s: s.updated(act_per_layer=per_layer, extra=working)  # noqa: E731
        tp = est.comm_of("tp")
        if tp is not None:
            fwd, _, sent = tp_block_collectives(ctx)
            blocks = m * max(st.layers for st in ctx.stages)
            comm = replace(
                tp,
                total=tp.total + blocks * fwd,
                exposed=tp.exposed + blocks * fwd,
                volume=tp.volume + blocks * sent / 2,
                detail=tp.detail + ", +2 in the recomputed forward",
            )
    return est.updated(stage_fn=stage_fn, comm=comm, compute=est.compute + extra, recompute=est.recompute + extra)


# -- precision ---------------------------------------------------------------------------------

#: Bytes per parameter and micro-batch that autocast moves outside the GEMMs: the fp32 -> bf16
#: weight cast (read 4, write 2) and folding the bf16 weight gradient into the fp32 ``.grad``
#: (read 2, read 4, write 4).
AUTOCAST_BYTES_PER_PARAM = 6 + 10


def bf16(ctx: CostContext, est: Estimate, options=None) -> Estimate:
    """bf16 mixed precision. With fp32 parameters under ``torch.autocast`` (DDP, ZeRO-1) every
    weight is cast to bf16 for its GEMM and the copy is saved for backward: 2 bytes per
    parameter while a step runs, and the casts and fp32 gradient accumulation cost
    :data:`AUTOCAST_BYTES_PER_PARAM` of memory traffic per micro-batch. FSDP's bf16 parameters
    (ZeRO-2/3) need neither. The bf16 compute rate and 2-byte activations are already in the
    context's dtypes."""
    if ctx.plan.train.precision != "bf16" or ctx.state_bytes.working < 4:
        return est
    params = max(st.params for st in ctx.stages)
    casts = ctx.micro_batches * AUTOCAST_BYTES_PER_PARAM * params / ctx.device.memory_rate
    return est.updated(
        stage_fn=lambda s: s.with_transient("bf16 weight copies (autocast)", 2 * ctx.stage(s.rank).params),
        compute=est.compute + casts,
    )


# -- data parallel -----------------------------------------------------------------------------


def _bucket_bytes(options) -> float:
    return float(getattr(options, "bucket", None) or DDP_BUCKET_BYTES)


def _grad_all_reduce(ctx: CostContext, bucket: float = DDP_BUCKET_BYTES) -> tuple[float, float, float]:
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


def _buckets(ctx: CostContext, rank: int) -> tuple[Term, ...]:
    """DDP's reducer keeps every gradient in a flat bucket buffer besides ``param.grad`` (the
    default ``gradient_as_bucket_view=False``: "the saved memory size will be equal to the
    total gradients size" when set, PyTorch DDP docs)."""
    if not ctx.profile.ddp_bucket_copy:
        return ()
    return (
        Term("DDP gradient buckets (a flat copy of every gradient)", ctx.grad_reduce_bytes * ctx.stage(rank).params),
    )


def ddp(ctx: CostContext, est: Estimate, options=None) -> Estimate:
    """DistributedDataParallel: all-reduce of the fp32 gradients, 2 Psi (ZeRO paper Sec. 7.1)."""
    lay = ctx.layout
    if lay.dp == 1:
        return est
    link = ctx.links["dp"]
    nbytes, seconds, exposed = _grad_all_reduce(ctx, _bucket_bytes(options))
    comm = CommCost(
        "dp",
        volume=2 * (lay.dp - 1) / lay.dp * nbytes,
        total=seconds,
        exposed=exposed,
        medium=link.medium,
        detail=f"all-reduce of {nbytes / 2**30:.2f} GiB fp32 gradients",
    )
    est = est.updated(stage_fn=lambda s: s.updated(transient=_buckets(ctx, s.rank)), comm=comm)
    return _with_contention(ctx, est, seconds - exposed)


def _with_contention(ctx: CostContext, est: Estimate, hidden: float) -> Estimate:
    """Charge the compute that overlapped data-parallel traffic takes away
    (:func:`planc.cost.compute.overlap_contention`)."""
    extra = hidden * overlap_contention(ctx.device)
    return est.with_time("compute slowed by overlapped DP traffic", extra) if extra > 0 else est


def _shard_states(ctx: CostContext, est: Estimate, zero: int, buffers, comm: CommCost) -> Estimate:
    """Shard the model states over the dp ranks (ZeRO stage ``zero``), add ``buffers(stage)``
    and the data-parallel traffic ``comm``."""
    n_d = ctx.layout.dp

    def shard(s: StageMemory) -> StageMemory:
        states = model_state_bytes(ctx.stage(s.rank).params, n_d, zero, ctx.state_bytes)
        return s.updated(
            params=states.params,
            master=states.master,
            grads=states.grads,
            optimizer=states.optimizer,
            transient=buffers(s),
        )

    return est.updated(stage_fn=shard, comm=comm, optimizer=est.optimizer / n_d)


def zero1(ctx: CostContext, est: Estimate, options=None) -> Estimate:
    """ZeRO-1 as torch runs it: DDP's all-reduce, then ``ZeroRedundancyOptimizer`` steps its
    1/N_d shard of the optimizer states and broadcasts the updated parameters (an all-gather
    of Psi fp32 values), after the step and before the next forward: fully exposed. Volume
    2 Psi + Psi, where DeepSpeed's reduce-scatter + all-gather would move 2 Psi (ZeRO Sec. 7.2)."""
    lay = ctx.layout
    if lay.dp == 1:
        return est
    link = ctx.links["dp"]
    nbytes, seconds, exposed = _grad_all_reduce(ctx, _bucket_bytes(options))
    params = ctx.state_bytes.working * max(st.params for st in ctx.stages)
    gather = all_gather_seconds(params, link)
    frac = (lay.dp - 1) / lay.dp
    comm = CommCost(
        "dp",
        volume=frac * (2 * nbytes + params),
        total=seconds + gather,
        exposed=exposed + gather,
        medium=link.medium,
        detail="all-reduce of gradients + all-gather of updated parameters",
    )
    est = _shard_states(ctx, est, 1, lambda s: _buckets(ctx, s.rank), comm)
    return _with_contention(ctx, est, seconds - exposed)


def fsdp(ctx: CostContext, est: Estimate, options=None) -> Estimate:
    """FSDP2 ``fully_shard``: ZeRO-2 (``reshard_after_forward=False``) and ZeRO-3.

    Over the dp group, per micro-batch: all-gather the bf16 parameters for the forward (ZeRO-3:
    again for the backward) and reduce-scatter the fp32 gradients (``reduce_dtype=fp32``) into
    the sharded ``.grad`` -- planc's default. With ``accumulate_unsharded`` (and always under
    pipelining, where torch's ``PipelineStage`` turns sync off for all micro-batches but the last)
    the reduce-scatter happens once per step instead. With one micro-batch that is the ZeRO
    paper's volume (Sec. 7.2-7.3: ZeRO-3 3 Psi elements, ZeRO-2 2 Psi), here 2 + 2 + 4 and
    2 + 4 bytes per parameter.

    Prefetching the next block hides a gather behind the previous block's compute; the first
    gather and the last reduce-scatter of each pass stay exposed. One collective per FSDP unit
    (each block, the root), each paying the ring latency.

    Memory: states sharded per ZeRO stage; transient one or two gathered blocks and one block's
    unsharded gradients; and when sync is deferred with m > 1 micro-batches, FSDP2 keeps the
    *unsharded* fp32 gradients of the whole stage between them (``to_accumulated_grad_if_needed``),
    4 bytes per parameter that ZeRO's gradient sharding does not remove.
    """
    lay = ctx.layout
    zero = lay.zero
    if lay.dp == 1:
        return est
    link = ctx.links["dp"]
    e, g = ctx.compute_bytes, ctx.grad_reduce_bytes
    m = ctx.micro_batches
    psi = max(st.params for st in ctx.stages)
    unit = max(st.layer_params for st in ctx.stages)
    units = max(st.layers + st.embedding + st.head for st in ctx.stages)
    gather = units * all_gather_seconds(e * psi / units, link)
    scatter = units * reduce_scatter_seconds(g * psi / units, link)
    gathers = 2 if zero == 3 else 1
    deferred = m > 1 and (lay.pp > 1 or bool(getattr(options, "accumulate_unsharded", False)))
    scatters = 1 if deferred else m
    # Under pipelining torch's PipelineStage keeps FSDP parameters unsharded after each backward
    # (set_reshard_after_backward(False), stage.py): ZeRO-2 gathers once per step, ZeRO-3 once
    # per backward plus the first forward.
    n_gathers = (1 if zero == 2 else m + 1) if lay.pp > 1 else m * gathers
    total = n_gathers * gather + scatters * scatter
    if ctx.profile.dp_overlap:
        slow = ctx.slowest
        first_gather = all_gather_seconds(e * unit, link)
        fwd = max(0.0, gather - slow.forward) + first_gather
        bwd_gather = (max(0.0, gather - slow.backward) + first_gather) if zero == 3 else 0.0
        bwd_scatter = max(0.0, (gather if zero == 3 else 0.0) + scatter - slow.backward) + reduce_scatter_seconds(
            g * unit, link
        )
        exposed = min(total, m * fwd + (m - scatters) * bwd_gather + scatters * bwd_scatter)
    else:
        exposed = total
    frac = (lay.dp - 1) / lay.dp
    when = "per step" if scatters == 1 else "per micro-batch"
    comm = CommCost(
        "dp",
        volume=frac * psi * (n_gathers * e + scatters * g),
        total=total,
        exposed=exposed,
        medium=link.medium,
        detail=(
            f"{n_gathers} parameter all-gather(s) per step"
            if lay.pp > 1
            else f"{gathers} parameter all-gather(s) per micro-batch"
        )
        + f", 1 gradient reduce-scatter {when}",
    )
    label = f"FSDP gathered parameters and unsharded gradients (ZeRO-{zero})"

    def buffers(s: StageMemory) -> tuple[Term, ...]:
        st = ctx.stage(s.rank)
        terms = (Term(label, fsdp_gather_bytes(st.largest_unit, zero, e, g)),)
        if deferred:
            terms += (Term("unsharded fp32 gradients kept across micro-batches", g * st.params),)
        if lay.pp > 1 and zero == 3 and m > 1:  # not resharded after backward (see n_gathers)
            terms += (Term("parameters left unsharded between micro-batches", e * st.params),)
        return terms

    # FSDP2 copies each gathered shard out of the all-gather buffer (read + write e bytes) and
    # casts the gradients to fp32 for the reduce-scatter (read e, write g): memory traffic.
    copies = psi * (n_gathers * 2 * e + scatters * (e + g)) / ctx.device.memory_rate
    est = _shard_states(ctx, est, zero, buffers, comm)
    return _with_contention(ctx, est.replace(compute=est.compute + copies), comm.total - comm.exposed)
