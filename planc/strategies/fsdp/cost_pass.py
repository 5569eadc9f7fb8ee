"""The plan-time cost pass of ``fsdp`` (pure; no torch)."""

from __future__ import annotations

from functools import partial

from planc.cost.block_backward import BACKWARD, RECOMPUTE
from planc.cost.comm import all_gather_seconds, all_reduce_seconds, norm_reductions, reduce_scatter_seconds
from planc.cost.context import CostContext
from planc.cost.data_parallel import (
    backwarded_layers,
    by_pp_rank,
    embedding_accumulated_at_peak,
    gained_by_the_embedding_backward,
    interleaved_gradient_bytes,
    moment_gradients,
    shard_states,
    weight_pass_gradient_bytes,
    with_contention,
)
from planc.cost.estimate import FROM_FIRST_BACKWARD, PHASES_JOINED, CommCost, Estimate, StageMemory, Term
from planc.cost.memory import fsdp_gather_bytes
from planc.cost.params import StageParams, embedding_params_per_shard, whole_embedding_gradient_rows
from planc.cost.wrappers import fsdp_seconds, with_dtensor_optimizer, with_wrapper_time
from planc.hardware.topology import GroupLink
from planc.spec.layout import Layout
from planc.zero_bubble import ZeroBubbleMoment

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
    held_at_peak = deferred and embedding_accumulated_at_peak(ctx, s)
    # Under a pipeline's deferred reduction the embedding's own gradient in compute precision lives
    # only in its backward, the backward's last (_pipelined_buffers): in fp32 too, where autograd
    # makes the new gradient before adding it to the accumulated one (AccumulateGrad), beside the
    # whole vocabulary's (simulated, TP 2 x PP 2, fp32: 4 MiB new beside 4 accumulated; -11%
    # without its own rows).
    own = e * embedding if lay.pp > 1 and deferred else 0.0
    if deferred:
        freed = ctx.freed_before_the_embedding_backward(st, s.act_layers) - gained_by_the_embedding_backward(ctx, s)
        accumulated, embedding_terms = whole_embedding_gradient(ctx, st, held_at_peak, own, freed)
    else:
        accumulated, embedding_terms = 0.0, reduced_embedding_gradient(ctx, st)
    if lay.pp > 1 and deferred:
        pipelined = _pipelined_buffers(st, head, zero, e, g, backwarded_layers(ctx, s), not _priced_moment(s))
        if _priced_moment(s):
            pipelined += _weight_pass_moment(ctx, s) + _resharded_at_the_moment(ctx, s)
        pipelined += _blocks_gathered_at_a_later_loss(ctx, st, s)
        return pipelined + _waiting_weight_gradients(ctx, s) + embedding_terms
    held, per_block = fsdp_gather_bytes(st.layer_params, root, head, zero, e, g)
    terms = [Term(f"FSDP block backward: 2 gathered + gradients (ZeRO-{zero})", per_block, BACKWARD)]
    if zero == 3 and lay.recompute != "none":  # the rerun's end: both blocks gathered, no gradient yet
        name = "FSDP recompute: the rerun block and the prefetched one, gathered"
        terms.append(Term(name, 2 * e * st.layer_params, RECOMPUTE))
    if held:
        terms.append(Term("FSDP root unit and head gradient (from the head's backward)", held, _AFTER_HEAD))
    terms += _root_gathers(ctx, st, root, head)
    if deferred:
        terms.append(Term(_ACCUMULATED, g * st.params + accumulated))
    return (*terms, *embedding_terms)


#: The phases from the head's backward to the embedding's: FSDP's root unit under ZeRO-3 and the
#: head's unsharded gradient exist only there (:func:`~planc.cost.memory.fsdp_gather_bytes`).
_AFTER_HEAD = PHASES_JOINED.join(("head backward", RECOMPUTE, BACKWARD, "embedding"))


def fsdp_forward_start_bytes(block: int, root: int, layers: int, zero: int, compute_bytes: int) -> float:
    """Bytes of FSDP2's gathers as a micro-batch's forward starts, beyond the model states, for
    ``layers`` blocks of ``block`` parameters and ``root`` parameters outside them.

    In the forward FSDP2 prefetches implicitly: a unit's all-gather output is kept after its
    copy-out until the next unit's ``wait_for_unshard`` (``comm_ctx.all_gather_state``), whose local
    ``prev_all_gather_state`` holds it until that unit's own copy-out is done (torch 2.13,
    ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``). So the root unit's all-gather
    output (e x root) lives beside the first block's all-gather output and its copy (2 e x block)
    and the root's gathered parameters; no activation exists yet. ZeRO-2 counts every parameter
    gathered in its states (:func:`~planc.cost.memory.runtime_state_bytes`), but after the previous backward resharded
    the blocks only the first is, (layers - 1) x e x block fewer; ZeRO-3 counts none gathered.
    ``planc verify --simulate`` (fp32, hidden 128, vocabulary 8192, dp 8): the peak of ZeRO-2,
    22.4 MiB, is here, 8 MiB of it the root's all-gather output.
    """
    e = compute_bytes
    if zero == 3:
        return 2 * e * root + 2 * e * block
    return e * root + e * block - e * block * (layers - 1)


def _root_gathers(ctx: CostContext, st: StageParams, root: int, head: int) -> tuple[Term, ...]:
    """The moments FSDP gathers the root unit with every gathered tensor of it alive at once.

    - As the forward starts (:func:`fsdp_forward_start_bytes`), with no
      activation yet (the finished micro-batch's are taken off: this phase holds none).
    - At the head's backward, beside the logits' gradient (the base estimate's term), the head's
      weight gradient is written, which the phase's held term counts; under ZeRO-3 the root is
      first gathered again, its all-gather output beside its copy until ``wait_for_unshard`` frees
      it after the copy-out (torch 2.13, ``_fsdp_param_group.py``): e x (root - head) more than the
      gradient that comes after.
      ``planc verify --simulate`` (fp32, hidden 128, vocabulary 8192, ZeRO-3): the peak, 23.9 MiB.
    """
    lay, e = ctx.layout, ctx.compute_bytes
    terms = []
    start = fsdp_forward_start_bytes(st.layer_params, root, st.layers, lay.zero, e) - ctx.chunk_activations(st)
    if start > 0:
        name = "FSDP forward start: the root's all-gather output kept to the first block's"
        terms.append(Term(name, start, "forward start"))
    if st.head and lay.zero == 3:
        name = "FSDP head backward: the root's all-gather output beside its copy"
        terms.append(Term(name, e * (root - head), "head backward"))
    # The root's reduce-scatter, the backward's last: its unsharded gradients beside their copy in
    # the reduce dtype (foreach_reduce), the root resharded first (post_backward) and under ZeRO-2
    # the blocks too, the activations gone. bf16 ZeRO-3: the peak (e + g) x root, 12 MiB of 16.8.
    resharded = _resharded_blocks(ctx, st) + (e * root if lay.zero == 2 else 0.0)
    scatter = (e + ctx.grad_reduce_bytes) * root - resharded - ctx.chunk_activations(st)
    if root and scatter > 0:
        name = "FSDP root unit's reduce-scatter: its gradients and their copy"
        terms.append(Term(name, scatter, "root reduce-scatter"))
    return tuple(terms)


def _resharded_blocks(ctx: CostContext, st: StageParams) -> float:
    """Bytes of gathered block parameters that ZeRO-2's states count (:func:`~planc.cost.memory.
    runtime_state_bytes`) but that FSDP2 has resharded once every block has run backward
    (``reshard_after_backward``, its default outside pipelines): at the embedding's backward and
    the root's reduce-scatter."""
    return ctx.compute_bytes * st.layer_params * st.layers if ctx.layout.zero == 2 else 0.0


def reduced_embedding_gradient(ctx: CostContext, st: StageParams) -> tuple[Term, ...]:
    """The embedding's backward when FSDP reduces every micro-batch: its gradient over this rank's
    rows in compute precision (the unsharded parameter's, e x the embedding's parameters on the
    rank), under TP the whole vocabulary's besides (e x V h: DTensor's ``embedding_dense_backward``
    has no row-sharded strategy, :func:`~planc.cost.params.whole_embedding_gradient_rows`; the
    local rows are a copy of it), and the last block's reduce-scatter input, kept until the root's
    (g x block, :func:`~planc.cost.memory.fsdp_gather_bytes`) -- when that micro-batch's activations
    on this chunk are gone: only what exceeds them counts, and only when no other phase holds more.
    The head's gradient and the ZeRO-3 root are the phase's held term; ZeRO-2's blocks are
    resharded by then (:func:`_resharded_blocks`). As DDP's over TP
    (``tensor_parallel`` pass). ``planc verify --simulate`` (hidden 128, vocabulary 8192, fp32):
    4 MiB + 0.76 at t = 1; at t = 2, 4 + 2 + 0.38 MiB, where 4 was priced ((e + g) x the rows beyond
    this rank's); with ZeRO-2's resharded blocks, 21.6 and 17.2 MiB peaks within 0.2%."""
    if not st.embedding:
        return ()
    model, e = ctx.model, ctx.compute_bytes
    whole = model.padded_vocab * model.hidden if ctx.layout.tp > 1 else 0
    reduce_input = ctx.grad_reduce_bytes * st.layer_params if st.layers else 0
    own = embedding_params_per_shard(model, ctx.layout.tp)
    arriving = e * (own + whole) + reduce_input - _resharded_blocks(ctx, st) - ctx.chunk_activations(st)
    if arriving <= 0:
        return ()
    name = "embedding gradient" + (" over the whole vocabulary and its local rows" if whole else "")
    return (Term(f"{name}, beyond the finished activations", arriving, "embedding"),)


def whole_embedding_gradient(
    ctx: CostContext, st: StageParams, held_at_peak: bool, own: float = 0.0, freed: float = 0.0
) -> tuple[float, tuple[Term, ...]]:
    """(bytes the accumulated gradients hold beyond ``st``'s own parameters, terms) for a
    vocabulary-parallel embedding's gradient, which comes out of backward over the whole
    vocabulary (:func:`~planc.cost.params.whole_embedding_gradient_rows`, r rows beyond this
    rank's): FSDP takes it as it comes.

    Reduced every micro-batch, :func:`reduced_embedding_gradient` prices it. Deferred to the step's
    end (under pipelining, or ``accumulate_unsharded``), FSDP2 accumulates the whole gradient
    (``to_accumulated_grad_if_needed``), g r h bytes from the first micro-batch's embedding backward
    to the step's end, and each later micro-batch's arrives beside it in compute precision, e r h
    bytes beyond the finished activations. Where a forward follows a backward (``held_at_peak``:
    1F1B, interleaved, zero-bubble, gradient accumulation without a pipeline) the stage's
    activations are back at their most with the accumulated gradient held; where every forward
    comes first (GPipe) the gradient first exists at the first embedding backward, priced there,
    (e + g) r h, the new gradient beside its first accumulation.
    ``planc verify --simulate`` of Llama 3 70B at TP 8 × PP 4 × DP 2, ZeRO-2, zero-bubble: the
    first stage held the [128256, 8192] fp32 gradient (3.9 GiB) through the step; priced only at
    the embedding's backward, and there less the finished activations, the peak read -4.7%.

    ``own``: bytes of the embedding's gradient over its own rows that exist only in its backward
    (:func:`_pipelined_buffers`), priced at the same moment; ``freed``: bytes gone by then beyond
    the finished activations, net of the gradients made since
    (:meth:`~planc.cost.context.CostContext.freed_before_the_embedding_backward`).
    """
    rows = whole_embedding_gradient_rows(ctx.model, ctx.layout.tp) if st.embedding else 0
    if not rows and not own:
        return 0.0, ()
    e, g, h = ctx.compute_bytes, ctx.grad_reduce_bytes, ctx.model.hidden
    accumulated = g * rows * h if held_at_peak else 0.0
    arriving = own + (e + (0 if held_at_peak else g)) * rows * h - ctx.chunk_activations(st) - freed
    if arriving <= 0:
        return accumulated, ()
    whole = " over the whole vocabulary" if rows else ""
    name = f"embedding gradient{whole}, beyond the finished activations"
    return accumulated, (Term(name, arriving, "embedding"),)


def _pipelined_buffers(
    st: StageParams, root: int, zero: int, e: int, g: int, backwarded: int, compute_precision: bool = True
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
      and that reduce-scatter makes them, when the activations are gone -- so the stage holds the
      accumulation in their place from its first backward on (:func:`accumulated_gradients`,
      ``StageMemory.accumulated_grads``), not here;
    - in mixed precision a unit's gradients exist in compute precision (e bytes) until its
      post-backward adds them to the fp32 ones: one block's while it runs backward, and the root
      unit's (``root`` parameters, the head on the last stage) from the head's backward until the
      backward's end, where the root's post-backward comes -- not in the loss before it (simulated,
      TP 2 x PP 2, bf16: +4% with it there); the embedding's only in its own backward, the
      backward's last (:func:`whole_embedding_gradient`; simulated: Llama 3 70B's first
      zero-bubble stage peaked in a block's backward without them);
    - in fp32 autograd adds each new gradient into the accumulated one: the transient is one
      parameter's gradient -- a block's largest is the MLP output projection's, which the block
      backward's own terms hold (:func:`~planc.cost.block_backward.block_backward_terms`); the
      head's, made once the logits' gradient is spent, takes no more than it; the embedding's
      comes in its own backward (:func:`whole_embedding_gradient`). (Priced as the embedding's in
      every block's backward, PP 2 x ZeRO-2 x DP 2's first rank, fp32, read -2.5 %: it peaked at
      the MLP output projection's two gradients, a block's backward's first op.)
    - ``compute_precision``: whether the gradients in compute precision are the usual ones above
      (a zero-bubble weight pass prices its own, :func:`_weight_pass_moment`);
    - ``backwarded``: ZeRO-3's blocks gathered at the peak (:func:`~planc.cost.data_parallel.backwarded_layers`).

    ``planc verify --simulate`` found the unpipelined terms kept these twice (tiny ZeRO-3 pipeline:
    predicted +31% and +26% over the simulated peak of the first and last stage) and no sharded
    gradient at the peak (tests/verify/test_simulate_pipeline.py)."""
    terms = []
    if e != g and compute_precision:
        terms.append(Term("FSDP block backward: its gradients in compute precision", e * st.layer_params, "backward"))
        if root:  # made by the head's backward (the embedding's: only in its own, priced there)
            terms.append(
                Term(
                    "FSDP root unit's gradients in compute precision (from the head's backward)", e * root, _AFTER_HEAD
                )
            )
    if zero == 3:  # not resharded after backward (see parameter_gathers)
        root_units = e * (st.params - st.layers * st.layer_params)
        terms.append(Term("parameters left unsharded between micro-batches", root_units))
        # A block still reshards after its forward (reshard_after_forward; the root does not under
        # pipelining): in the forward and the loss only the root is gathered (simulated, TP 2 x
        # PP 2, ZeRO-3: the last stage +2.7% in fp32 with its block counted at the loss).
        gathered = e * backwarded * st.layer_params
        terms.append(Term("blocks' parameters gathered from their backward on", gathered, _AFTER_HEAD))
    return tuple(terms)


def _priced_moment(s: StageMemory) -> ZeroBubbleMoment | None:
    """``s``'s zero-bubble moment where it prices FSDP's gradients itself
    (:func:`~planc.cost.data_parallel.moment_gradients`): a weight pass, or an input pass's start."""
    moment = s.zero_bubble_moment
    return moment if moment is not None and (moment.weight_pass or moment.input_pass) else None


def accumulated_gradients(ctx: CostContext, s: StageMemory) -> float:
    """Bytes of gradients FSDP under a pipeline keeps on stage ``s`` from its first backward on, in
    place of the sharded ones the model states count (``StageMemory.accumulated_grads``): the
    stage's unsharded fp32 accumulation, g bytes per parameter (:func:`_pipelined_buffers`), and
    what a vocabulary-parallel embedding's holds beyond its rows (:func:`whole_embedding_gradient`)
    -- at a zero-bubble moment that prices its own, less the stages' accumulations not made yet
    there, the reduced stages' counting their sharded gradients
    (:func:`~planc.cost.data_parallel.moment_gradients`; ``absent`` less its parameters).

    The sharded gradients themselves are no part of it: they exist only after the step's last
    micro-batch. Priced as a buffer "less the sharded ones", the last zero-bubble rank with one
    round of micro-batches (PP 4 x DP 2, v = 2, 4 micro-batches), which holds no accumulation at
    its peak, printed -12.5 MiB "held" beside 12.5 MiB of gradients that do not exist."""
    lay, st = ctx.layout, ctx.stage(s.rank)
    whole = whole_embedding_gradient(ctx, st, embedding_accumulated_at_peak(ctx, s))[0]
    # interleaved, one round: none for the stages not begun, the shards of those done
    accumulated = interleaved_gradient_bytes(ctx, s.rank, s.stages_without_grads) + whole
    moment = _priced_moment(s)
    if lay.pp > 1 and moment is not None:
        kept = moment_gradients(ctx, s.rank, moment)
        accumulated -= kept.absent - kept.resharded
    return accumulated


def _resharded_at_the_moment(ctx: CostContext, s: StageMemory) -> tuple[Term, ...]:
    """A correction, negative: at a zero-bubble moment after one of the rank's stages was reduced
    (one round of micro-batches), ``perform_reduce_grad`` has resharded that stage's parameters,
    which ZeRO-2's working copy counts gathered (:func:`~planc.cost.memory.model_state_bytes`)
    -- a model state that does not change with the moment, so the moment takes them off here."""
    moment = s.zero_bubble_moment
    resharded = moment_gradients(ctx, s.rank, moment).resharded if moment is not None else 0.0
    if not resharded:
        return ()
    name = "less the parameters resharded by their stage's reduction (the working copy counts them gathered)"
    return (Term(name, -resharded, held=FROM_FIRST_BACKWARD),)


def _blocks_gathered_at_a_later_loss(ctx: CostContext, st: StageParams, s: StageMemory) -> tuple[Term, ...]:
    """ZeRO-3 on the loss's stage where every forward comes first (GPipe: ``first_backward_frees``):
    the blocks' gathered parameters at a later micro-batch's loss, e bytes per block parameter.

    FSDP2 reshards a unit only after its forward (``reshard_after_forward``) or in a backward that
    may reshard, and ``PipelineStage`` forbids that until the step's last
    (``set_reshard_after_backward(False)``; ``perform_reduce_grad`` reshards): from the first
    micro-batch's backward on the stage's blocks stay gathered, and no forward follows to
    reshard them -- through every later micro-batch's loss, not only the backward phases that
    :func:`_pipelined_buffers`' term names. (Under 1F1B a forward comes between, and its
    ``post_forward`` reshards each block before the next loss.) ``planc verify --simulate``,
    tiny TP 2 x PP 2 x DP 2, GPipe, last stage, fp32: at its peak, the second micro-batch's loss,
    every block's unsharded parameters live (0.76 MiB of 31.5), which the model did not count
    (-1.8%; bf16 -1.2%)."""
    if ctx.layout.zero != 3 or not st.head or not s.first_backward_frees:
        return ()
    blocks = ctx.compute_bytes * st.layers * st.layer_params
    name = "blocks' parameters still gathered at a later micro-batch's loss"
    return (Term(name, blocks, "loss", held=FROM_FIRST_BACKWARD),) if blocks else ()


def _weight_pass_moment(ctx: CostContext, s: StageMemory) -> tuple[Term, ...]:
    """Zero-bubble's last rank with two rounds of micro-batches peaks in its last stage's weight
    pass (:func:`planc.zero_bubble.zero_bubble_moments`), where FSDP holds, in compute precision, the
    stage's gradients from its earlier weight passes since its last input pass (its blocks' and
    the root unit's: the head's backward is in the weight pass too) and the new gradients of the
    parameter group running (:func:`~planc.cost.data_parallel.weight_pass_moment_bytes`); the
    other stages' accumulation is priced less those waiting for the first time (``_buffers``).
    ``planc verify --simulate``, PP 4 x DP 2, v = 2, 8 micro-batches, last rank (7W5): 6.5 + 4 MiB
    of a 97.5 MiB peak. The model counted, at the activations' peak, the last stage's gradients
    and the other stage's fp32 accumulation, neither there yet (+5.0%). Both terms belong to the
    weight pass, a backward ("backward"): no loss runs beside them."""
    moment = s.zero_bubble_moment
    if moment is None:
        return ()
    kept = moment_gradients(ctx, s.rank, moment)
    pass_name = "input pass" if moment.input_pass else "weight pass"
    terms = [
        Term("weight pass: the running parameter group's new gradients (the MLP's)", kept.new, "backward"),
        Term(f"{pass_name}: the stage's gradients from its earlier weight passes", kept.own, "backward"),
    ]
    return tuple(t for t in terms if t.value)


def _waiting_weight_gradients(ctx: CostContext, s: StageMemory) -> tuple[Term, ...]:
    """Zero-bubble: the weight-pass gradients of the rank's other stages that wait, in compute
    precision, for their stage's next input pass, whose post-backward hook adds them into the
    accumulated fp32 ones (:func:`~planc.cost.data_parallel.weight_pass_gradient_bytes`); how many
    stages wait at the peak is the schedule's (``StageMemory.weight_grads_waiting``, from
    :func:`planc.zero_bubble.zero_bubble_peaks`). ``planc verify --simulate`` found them at the peak of
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
    # The gradient norm over the shards, waited on before clipping: one all-reduce per kind of
    # gradient, which tensor parallelism splits in three (column, row, replicated).
    norm_seconds, norm_volume = norm_reductions(3 if lay.tp > 1 else 1, link)
    total, exposed = total + norm_seconds, exposed + norm_seconds
    shards, copies_of_states = lay.shard_degree, lay.replicate_groups
    frac = (shards - 1) / shards
    # Ring all-reduce of the 1/s shard over r replicas: 2 (r - 1) / r of its g * psi / s bytes.
    replica_volume = scatters * 2 * (copies_of_states - 1) / copies_of_states * g * psi / shards
    moved = frac * psi * (n_gathers * e + scatters * g) + replica_volume
    comm = CommCost(
        "dp",
        volume=moved + norm_volume,
        volume_by_pp_rank=by_pp_rank(ctx, moved, norm_volume),
        total=total,
        exposed=exposed,
        medium=link.medium,
        detail=_traffic_text(lay, n_gathers, scatters) + ", the gradient norm's all-reduce",
    )
    # FSDP2 copies each gathered shard out of the all-gather buffer (read + write e bytes) and
    # casts the gradients to fp32 for the reduce-scatter (read e, write g): memory traffic.
    copies = psi * (n_gathers * 2 * e + scatters * (e + g)) / ctx.device.memory_rate
    buffers = partial(_buffers, ctx, deferred)
    # A pipeline's FSDP gradients are its accumulated ones, which exist from the first backward
    # on (_pipelined_buffers): where every forward comes first, none exists at the forwards' peak.
    pipelined = lay.pp > 1 and deferred
    # One micro-batch per step: its forward runs before any backward, so the sharded gradients
    # (set to None by the last step) do not exist yet at the forward's end either.
    est = shard_states(ctx, est, zero, buffers, comm, keeps_first_backward=pipelined or m == 1)
    if pipelined:  # the accumulation, in place of the sharded gradients (accumulated_gradients)
        est = est.map_stages(lambda s: s.updated(accumulated_grads=accumulated_gradients(ctx, s)))
    est = with_wrapper_time(est, _WRAPPER, fsdp_seconds(ctx, units, n_gathers + scatters))
    est = with_dtensor_optimizer(est, ctx)  # fully_shard's parameters are DTensors
    return with_contention(ctx, est.replace(compute=est.compute + copies), comm.total - comm.exposed)
