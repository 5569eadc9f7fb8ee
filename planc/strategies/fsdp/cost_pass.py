"""The plan-time cost pass of ``fsdp`` (pure; no torch)."""

from __future__ import annotations

from functools import partial

from planc.cost.comm import all_gather_seconds, all_reduce_seconds, reduce_scatter_seconds
from planc.cost.context import CostContext
from planc.cost.data_parallel import shard_states, weight_pass_gradient_bytes, with_contention
from planc.cost.estimate import CommCost, Estimate, StageMemory, Term
from planc.cost.memory import fsdp_gather_bytes, model_state_bytes
from planc.cost.params import StageParams, embedding_params_per_shard, whole_embedding_gradient_rows
from planc.cost.wrappers import fsdp_seconds, with_dtensor_optimizer, with_wrapper_time
from planc.hardware.topology import GroupLink
from planc.spec.layout import Layout

_ACCUMULATED = "unsharded fp32 gradients kept across micro-batches"


def parameter_gathers(zero: int, micro_batches: int, pp: int) -> int:
    """Parameter all-gathers per step: one per forward (ZeRO-3: and one per backward) of every
    micro-batch -- except under pipelining, where torch's ``PipelineStage`` keeps the FSDP
    parameters unsharded after each backward (``set_reshard_after_backward(False)``, stage.py):
    ZeRO-2 then gathers once per step, ZeRO-3 once per backward plus the first forward."""
    if pp > 1:
        return 1 if zero == 2 else micro_batches + 1
    return micro_batches * (2 if zero == 3 else 1)


def _gathers_text(zero: int, per_step: int, pp: int) -> str:
    if pp > 1:
        return f"{per_step} parameter all-gather(s) per step"
    return f"{2 if zero == 3 else 1} parameter all-gather(s) per micro-batch"


def reduce_gradients_seconds(nbytes: float, link: GroupLink, replicas: GroupLink | None, shards: int) -> float:
    """Reduce-scatter ``nbytes`` of gradients over ``link``; with HSDP (``replicas``) FSDP2 then
    all-reduces each rank's 1/``shards`` shard across the replica group."""
    seconds = reduce_scatter_seconds(nbytes, link)
    return seconds + (all_reduce_seconds(nbytes / shards, replicas) if replicas is not None else 0.0)


def _buffers(ctx: CostContext, deferred: bool, s: StageMemory) -> tuple[Term, ...]:
    """FSDP's buffers on stage ``s`` beside its sharded states (see :func:`cost`)."""
    lay, zero = ctx.layout, ctx.layout.zero
    e, g = ctx.compute_bytes, ctx.grad_reduce_bytes
    st = ctx.stage(s.rank)
    root = st.params - st.layers * st.layer_params
    embedding = embedding_params_per_shard(ctx.model, lay.tp) if st.embedding else 0
    head = root - embedding
    # Every forward the stage holds at once runs before its first backward (GPipe): no gradient is
    # accumulated yet at that peak (the pipeline pass said so; FSDP's own terms take it from here).
    held_at_peak = deferred and not s.first_backward_frees
    # Under a pipeline's deferred reduction the embedding's own gradient in compute precision lives
    # only in its backward, the backward's last (_pipelined_buffers).
    own = e * embedding if lay.pp > 1 and deferred and e != g else 0.0
    accumulated, embedding_terms = whole_embedding_gradient(ctx, st, held_at_peak, own)
    if lay.pp > 1 and deferred:
        sharded = model_state_bytes(st.params, lay.shard_degree, zero, ctx.state_bytes).grads
        largest = root if root else ctx.model.ffn * ctx.model.hidden / lay.tp
        pipelined = _pipelined_buffers(st, head, largest, zero, e, g, sharded, accumulated)
        return pipelined + _waiting_weight_gradients(ctx, s) + embedding_terms
    held, per_block = fsdp_gather_bytes(st.layer_params, root, head, zero, e, g)
    terms = [Term(f"FSDP block backward: 2 gathered + gradients (ZeRO-{zero})", per_block, "backward")]
    if held:
        terms.append(Term("FSDP root unit and head gradient (all backward)", held))
    if deferred:
        terms.append(Term(_ACCUMULATED, g * st.params + accumulated))
    return (*terms, *embedding_terms)


def whole_embedding_gradient(
    ctx: CostContext, st: StageParams, held_at_peak: bool, own: float = 0.0
) -> tuple[float, tuple[Term, ...]]:
    """(bytes the accumulated gradients hold beyond ``st``'s own parameters, terms) for a
    vocabulary-parallel embedding's gradient, which comes out of backward over the whole
    vocabulary (:func:`~planc.cost.params.whole_embedding_gradient_rows`, r rows beyond this
    rank's): FSDP takes it as it comes.

    - Reduced every micro-batch: at the end of the embedding's backward the gradient is whole in
      compute precision and in the fp32 of the reduction, (e + g) r h bytes, when that
      micro-batch's activations on this chunk are gone: only what exceeds them counts (under a
      pipeline the other micro-batches' stay), and only when no other phase holds more (phase
      "embedding"). Simulated at t = 2 and 4, in bf16 and fp32 (docs/verify.md).
    - Deferred to the step's end (under pipelining, or ``accumulate_unsharded``): FSDP2 accumulates
      the whole gradient (``to_accumulated_grad_if_needed``), g r h bytes from the first
      micro-batch's embedding backward to the step's end, and each later micro-batch's arrives
      beside it in compute precision, e r h bytes beyond the finished activations. Where a
      forward follows a backward (``held_at_peak``: 1F1B, interleaved, zero-bubble, gradient
      accumulation without a pipeline) the stage's activations are back at their most with the
      accumulated gradient held; where every forward comes first (GPipe) the gradient first exists
      at the first embedding backward, priced there as when reduced every micro-batch.
      ``planc verify --simulate`` of Llama 3 70B at TP 8 × PP 4 × DP 2, ZeRO-2, zero-bubble: the
      first stage held the [128256, 8192] fp32 gradient (3.9 GiB) through the step; priced only at
      the embedding's backward, and there less the finished activations, the peak read -4.7%.

    ``own``: bytes of the embedding's gradient over its own rows that exist only in its backward
    (:func:`_pipelined_buffers`), priced at the same moment.
    """
    rows = whole_embedding_gradient_rows(ctx.model, ctx.layout.tp) if st.embedding else 0
    if not rows and not own:
        return 0.0, ()
    e, g, h = ctx.compute_bytes, ctx.grad_reduce_bytes, ctx.model.hidden
    accumulated = g * rows * h if held_at_peak else 0.0
    arriving = own + (e + (0 if held_at_peak else g)) * rows * h - ctx.chunk_activations(st)
    if arriving <= 0:
        return accumulated, ()
    whole = " over the whole vocabulary" if rows else ""
    name = f"embedding gradient{whole}, beyond the finished activations"
    return accumulated, (Term(name, arriving, "embedding"),)


def _pipelined_buffers(
    st: StageParams,
    root: int,
    largest: float,
    zero: int,
    e: int,
    g: int,
    sharded_grads: float,
    whole: float,
) -> tuple[Term, ...]:
    """FSDP's buffers on a pipeline stage with several micro-batches. torch's ``PipelineStage``
    keeps the parameters unsharded after each backward and defers the gradient reduction to the
    step's end (``set_reshard_after_backward(False)``, ``set_requires_gradient_sync(False)``):

    - ZeRO-3: by the end of a backward every unit of the stage is gathered, e bytes per
      parameter -- the blocks that a backward gathers and the root unit are among them, not beside;
    - the stage's gradients accumulate unsharded in fp32 (``to_accumulated_grad_if_needed``), g
      bytes per parameter, until the one reduce-scatter after the last micro-batch: the gradient
      copies a per-micro-batch reduce-scatter would take never exist mid-step, and neither do the
      sharded gradients that the model states count -- the optimizer's ``zero_grad`` freed them
      and that reduce-scatter makes them, when the activations are gone -- so the term is the
      unsharded gradients less the sharded ones;
    - in mixed precision a unit's gradients exist in compute precision (e bytes) until its
      post-backward adds them to the fp32 ones: one block's while it runs backward, and the root
      unit's (``root`` parameters, the head on the last stage) from the backward's start until its
      end, where the root's post-backward comes; the embedding's only in its own backward, the
      backward's last (:func:`whole_embedding_gradient`; simulated: Llama 3 70B's first
      zero-bubble stage peaked in a block's backward without them);
    - in fp32 autograd adds each new gradient into the accumulated one: the transient is one
      parameter's gradient, at most the ``largest`` (the embedding or head, else a block's FFN matrix);
    - ``whole``: what a vocabulary-parallel embedding's accumulated gradient holds beyond its rows
      (:func:`whole_embedding_gradient`).

    ``planc verify --simulate`` found the unpipelined terms kept these twice (tiny ZeRO-3 pipeline:
    predicted +31% and +26% over the simulated peak of the first and last stage) and no sharded
    gradient at the peak (tests/verify/test_simulate_pipeline.py)."""
    terms = []
    if e != g:
        terms.append(Term("FSDP block backward: its gradients in compute precision", e * st.layer_params, "backward"))
        if root:
            terms.append(Term("FSDP root unit's gradients in compute precision (all backward)", e * root))
    else:
        terms.append(Term("a new gradient before it is added to the accumulated one", e * largest, "backward"))
    unsharded = g * st.params + whole - sharded_grads
    terms.append(Term(f"{_ACCUMULATED} (less the sharded ones)", unsharded))
    if zero == 3:  # not resharded after backward (see parameter_gathers)
        terms.append(Term("parameters left unsharded between micro-batches", e * st.params))
    return tuple(terms)


def _waiting_weight_gradients(ctx: CostContext, s: StageMemory) -> tuple[Term, ...]:
    """Zero-bubble: the weight-pass gradients of the rank's other stages that wait, in compute
    precision, for their stage's next input pass, whose post-backward hook adds them into the
    accumulated fp32 ones (:func:`~planc.cost.data_parallel.weight_pass_gradient_bytes`); how many
    stages wait at the peak is the schedule's (``StageMemory.weight_grads_waiting``, from
    :func:`planc.stages.zero_bubble_peaks`). ``planc verify --simulate`` found them at the peak of
    every rank that runs a later stage's input pass from the second round of micro-batches on; the
    block the running stage writes is :func:`_pipelined_buffers`' own term."""
    if not s.weight_grads_waiting:
        return ()
    nbytes = weight_pass_gradient_bytes(ctx, s.rank)
    if not nbytes:
        return ()
    name = f"weight-pass gradients waiting for their stage's next input pass ({s.weight_grads_waiting} stages)"
    return (Term(name, s.weight_grads_waiting * nbytes),)


def _traffic_text(lay: Layout, n_gathers: int, scatters: int) -> str:
    when = "per step" if scatters == 1 else "per micro-batch"
    text = f"{_gathers_text(lay.zero, n_gathers, lay.pp)}, 1 gradient reduce-scatter {when}"
    if lay.shard_group:
        s, r = lay.shard_group, lay.replicate_groups
        text += f" over groups of {s}, + all-reduce of the 1/{s} gradient shard across {r} replicas"
    return text


def _exposed_with_prefetch(
    ctx: CostContext, zero: int, gather: float, scatter: float, first: tuple[float, float], scatters: int
) -> float:
    """Exposed seconds when each unit's gather is prefetched behind the previous unit's compute:
    what exceeds the pass's compute, plus the first gather (and the last unit's reduce-scatter)."""
    slow, m = ctx.slowest, ctx.micro_batches
    first_gather, last_scatter = first
    fwd = max(0.0, gather - slow.forward) + first_gather
    bwd_gather = (max(0.0, gather - slow.backward) + first_gather) if zero == 3 else 0.0
    bwd_scatter = max(0.0, (gather if zero == 3 else 0.0) + scatter - slow.backward) + last_scatter
    return m * fwd + (m - scatters) * bwd_gather + scatters * bwd_scatter


_WRAPPER = "FSDP hooks and copies (measured)"


def cost(ctx: CostContext, est: Estimate, options: object = None) -> Estimate:
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

    Memory: states sharded per ZeRO stage; held through backward, the root unit (embedding, final
    norm and head; gathered under ZeRO-3) and the head's unsharded gradient; while a block runs
    backward, two gathered blocks and its unsharded gradients
    (:func:`~planc.cost.memory.fsdp_gather_bytes`; the "backward" phase, not held beside the
    loss's buffers); and when sync is deferred with m > 1 micro-batches, FSDP2 keeps the
    *unsharded* fp32 gradients of the whole stage between them (``to_accumulated_grad_if_needed``),
    4 bytes per parameter that ZeRO's gradient sharding does not remove.

    HSDP (``shard_group`` = s of the dp ranks, r = dp / s replicas): gathers and reduce-scatters
    run over the shard group (inside a node when s fits one), and after each unit's reduce-scatter
    FSDP2 all-reduces the 1/s gradient shard across the r replicas; states are sharded 1/s.
    """
    lay = ctx.layout
    zero = lay.zero
    if lay.dp == 1:
        return est
    hybrid = bool(lay.shard_group)
    link = ctx.links["dp_shard" if hybrid else "dp"]
    e, g = ctx.compute_bytes, ctx.grad_reduce_bytes
    m = ctx.micro_batches
    psi = max(st.params for st in ctx.stages)
    unit = max(st.layer_params for st in ctx.stages)
    units = max(st.layers + st.embedding + st.head for st in ctx.stages)
    replicas = ctx.links["dp_replicate"] if hybrid else None

    def reduce_grads(nbytes: float) -> float:
        return reduce_gradients_seconds(nbytes, link, replicas, lay.shard_degree)

    gather = units * all_gather_seconds(e * psi / units, link)
    scatter = units * reduce_grads(g * psi / units)
    deferred = m > 1 and (lay.pp > 1 or bool(getattr(options, "accumulate_unsharded", False)))
    scatters = 1 if deferred else m
    n_gathers = parameter_gathers(zero, m, lay.pp)
    total = n_gathers * gather + scatters * scatter
    exposed = total
    if ctx.profile.dp_overlap:
        first = (all_gather_seconds(e * unit, link), reduce_grads(g * unit))
        exposed = min(total, _exposed_with_prefetch(ctx, zero, gather, scatter, first, scatters))
    shards, copies_of_states = lay.shard_degree, lay.replicate_groups
    frac = (shards - 1) / shards
    # Ring all-reduce of the 1/s shard over r replicas: 2 (r - 1) / r of its g * psi / s bytes.
    replica_volume = scatters * 2 * (copies_of_states - 1) / copies_of_states * g * psi / shards
    comm = CommCost(
        "dp",
        volume=frac * psi * (n_gathers * e + scatters * g) + replica_volume,
        total=total,
        exposed=exposed,
        medium=link.medium,
        detail=_traffic_text(lay, n_gathers, scatters),
    )
    # FSDP2 copies each gathered shard out of the all-gather buffer (read + write e bytes) and
    # casts the gradients to fp32 for the reduce-scatter (read e, write g): memory traffic.
    copies = psi * (n_gathers * 2 * e + scatters * (e + g)) / ctx.device.memory_rate
    buffers = partial(_buffers, ctx, deferred)
    est = with_wrapper_time(shard_states(ctx, est, zero, buffers, comm), _WRAPPER, fsdp_seconds(ctx, units))
    est = with_dtensor_optimizer(est, ctx)  # fully_shard's parameters are DTensors
    return with_contention(ctx, est.replace(compute=est.compute + copies), comm.total - comm.exposed)
