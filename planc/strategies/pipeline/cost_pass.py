"""The plan-time cost pass of ``pipeline`` (pure; no torch).

Where stages sit, how many micro-batches each rank holds in flight and the bubble's closed form
are :mod:`planc.stages`'s, the arithmetic the program and ``planc explain``'s timeline use.
"""

from __future__ import annotations

from dataclasses import replace

from planc import stages, zero_bubble
from planc.cost.comm import all_gather_seconds, all_reduce_seconds, norm_reductions, p2p_seconds
from planc.cost.context import CostContext
from planc.cost.data_parallel import interleaved_gradient_bytes, moment_gradients, weight_pass_gradient_bytes
from planc.cost.estimate import UNTIL_LATER_LOSS, CommCost, Estimate, StageMemory, Term
from planc.cost.memory import (
    SCHEDULES_HOLDING_LOGITS,
    head_saved_bytes,
    loss_checkpointed,
    loss_in_forward,
    loss_saved_bytes,
    micro_batches_holding_logits,
    split_backward_output_grads,
)
from planc.cost.params import first_chunks_params
from planc.cost.wrappers import pp_seconds, split_backward_seconds, with_wrapper_time
from planc.hardware.topology import GroupLink
from planc.units import format_bytes

#: The named time term of zero-bubble's split backward (the host work of its two halves beyond one backward).
SPLIT_BACKWARD = "zero-bubble's split backward (measured)"


def cost(ctx: CostContext, est: Estimate, options: object = None) -> Estimate:
    """Pipeline parallelism (Narayanan et al. 2021, Sec. 2.2; Qi et al. 2023 for zero-bubble).

    - **Activations**: rank i holds :func:`~planc.stages.chunks_in_flight` stage-micro-batches
      of (its layers / v) blocks each.
    - **Zero-bubble** keeps each stage-micro-batch's graph from its forward to its weight pass,
      and from its input pass on the output gradients of its linears and norms
      (:func:`~planc.cost.memory.split_backward_output_grads`), and under FSDP its other stages'
      weight-pass gradients wait for their next input pass
      (:func:`~planc.cost.data_parallel.weight_pass_gradient_bytes`; the fsdp pass prices them): the
      rank's peak is the largest of the placements :func:`~planc.zero_bubble.zero_bubble_peaks` reads
      off torch's order.
    - **Losses**: under GPipe the last stage runs every micro-batch's forward and loss before any
      backward, so m - 1 more losses wait with their saved tensors
      (:func:`~planc.cost.memory.loss_saved_bytes`); under zero-bubble those in flight, or all m
      with a recomputed loss (:func:`~planc.cost.memory.micro_batches_holding_logits`); the other
      schedules run the last stage's backward right after its forward.
    - **Gradients** do not exist yet where a rank's activations peak before its first backward
      (every GPipe rank): they are counted from the backward on (``first_backward_frees``).
    - **Receive buffers**: torch's stages allocate an activation buffer (every stage but the
      first) and a gradient buffer (every stage but the last) for each of the m x v
      stage-micro-batches; Megatron only for the one in flight.
    - **Bubble** in micro-batch slots (:func:`~planc.stages.bubble_slots`): (p - 1)/v for GPipe,
      1F1B and interleaved (when m >= p); zero-bubble runs the weight-gradient passes in it,
      leaving (f + b - 2 w)/(f + b) of it (a third when the three passes take equal time).
    - **p2p**: each stage-micro-batch sends its boundary tensor forward and its gradient back:
      2 m v transfers of ``ctx.boundary_bytes`` between two neighbouring ranks (2 m (2 v - 1) with
      pp = 2, whose two ranks also share the wrap from the last stage of a round to the first of
      the next: :func:`~planc.stages.busiest_rank_pair_boundaries`), priced on the slowest boundary between stages
      (``ctx.links["pp_p2p"]``: one that crosses nodes, even when the first does not). torch
      posts them asynchronously: only the p v - 1 hops of warm-up and the same of cool-down, each
      at its own link, and any excess of a slowest-boundary transfer over a stage's compute, are
      exposed; Megatron 2021 waits on each. (Under ZBV one hop per direction stays on its rank,
      the turn of the V: free on the warm-up's path, and not among the 2 m v transfers.)
    """
    if ctx.layout.pp == 1:
        return est
    est = with_wrapper_time(est, "pipeline schedule actions (measured)", pp_seconds(ctx), per_micro_batch=True)
    if ctx.layout.schedule == "zero-bubble":
        est = with_wrapper_time(est, SPLIT_BACKWARD, split_backward_seconds(ctx), per_micro_batch=True)
    return est.updated(
        stage_fn=lambda s: _stage_memory(ctx, s),
        comm=_with_step_reductions(ctx, _p2p(ctx)),
        bubble_slots=est.bubble_slots + _bubble(ctx),
    )


def _stage_memory(ctx: CostContext, s: StageMemory) -> StageMemory:
    lay = ctx.layout
    v, m = lay.virtual_stages, ctx.micro_batches
    st = ctx.stage(s.rank)
    chunks = stages.chunks_in_flight(lay.schedule, lay.pp, v, m, s.rank, ctx.stage_style)
    if ctx.profile.pp_recv_buffers == "per_microbatch":
        activations, gradients = m * (v - st.embedding), m * (v - st.head)
        buffers = activations + gradients
        label = f"pipeline receive buffers ({_receive_buffers_text(activations, gradients)})"
    else:
        buffers = (not st.embedding or v > 1) + (not st.head or v > 1)
        label = "pipeline send/receive buffers"
    terms: tuple[Term, ...] = (Term(label, buffers * ctx.boundary_bytes),) if buffers else ()
    weights_waiting = without_grads = 0
    moment = None
    if lay.schedule == "interleaved":
        peak = _interleaved_peak(ctx, s.rank)
        chunks, without_grads = peak.held, v - peak.begun
        terms += _sends_held(ctx, peak.sends)
    elif lay.schedule == "zero-bubble":
        moment, split = _zero_bubble_terms(ctx, s)
        chunks, weights_waiting = moment.held, moment.weights
        terms += split
    turn = stages.holds_turn(s.rank, lay.pp, ctx.stage_style)
    sent = _outputs_held(v, chunks, st.head, turn) if ctx.profile.pp_outputs_kept else 0
    if sent:
        # torch's stage keeps each chunk-micro-batch's output (``fwd_cache``) from its forward to
        # its backward, which starts from it (``stage_backward(outputs, output_grads)``); the output
        # of a stage's last block is saved by no block of the stage (simulated: the first of two
        # stages held two boundary tensors more than its blocks' activations, 1F1B).
        terms += (
            Term(f"stage outputs kept for their backward ({sent} chunk-micro-batches)", sent * ctx.boundary_bytes),
        )
    if st.head:
        terms += _waiting_micro_batches(ctx) + _kept_logits(ctx)
    if st.head and m > 1 and lay.schedule not in SCHEDULES_HOLDING_LOGITS:
        # torch's schedules keep the last forward's output in a loop variable (``output =
        # stage.forward_one_chunk(...)``) until the next forward returns: while the head writes a
        # micro-batch's logits the previous micro-batch's are still alive (simulated: 1F1B's last
        # stage of a 4-layer Llama 3 8B, one 1.96 GiB tensor of logits more from the second
        # micro-batch on). GPipe and zero-bubble keep them anyway (above).
        name = "the previous micro-batch's logits, still held by the schedule's loop"
        terms += (Term(name, ctx.head_output_bytes, "forward"),)
    # Every forward the rank holds at once runs before its first backward (GPipe; the other
    # schedules' ranks with few micro-batches): the gradients do not exist yet at that peak
    # (StageMemory.first_backward_frees).
    before_any_backward = chunks >= v * m
    return s.updated(
        act_layers=chunks * st.layers / v,
        transient=terms,
        first_backward_frees=st.layers / v if before_any_backward else 0.0,
        weight_grads_waiting=weights_waiting,
        zero_bubble_moment=moment,
        stages_without_grads=without_grads,
        absent_grads=ctx.state_bytes.grads * first_chunks_params(ctx.model, lay.tp, st, without_grads),
    )


def _interleaved_peak(ctx: CostContext, rank: int) -> stages.InterleavedMoment:
    """The moment of an interleaved rank's peak: the largest of
    :func:`~planc.stages.interleaved_peaks`' moments, a stage-micro-batch's blocks' activations (as
    the plan recomputes them) against the gradients data parallelism holds there
    (:func:`~planc.cost.data_parallel.interleaved_gradient_bytes`) and the boundary tensors held by
    finished sends (where the program keeps them: torch's schedule; none counted elsewhere)."""
    lay = ctx.layout
    v = lay.virtual_stages
    chunk = ctx.chunk_activations(ctx.stage(rank))
    sent = ctx.boundary_bytes if ctx.profile.pp_sends_kept else 0.0

    def held(moment: stages.InterleavedMoment) -> float:
        grads = interleaved_gradient_bytes(ctx, rank, v - moment.begun)
        return moment.held * chunk + grads + moment.sends * sent

    peak = max(stages.interleaved_peaks(lay.pp, v, ctx.micro_batches, rank), key=held)
    return peak if ctx.profile.pp_sends_kept else peak._replace(sends=0)


def _sends_held(ctx: CostContext, sends: int) -> tuple[Term, ...]:
    """The boundary tensors finished sends hold at the peak (:func:`~planc.stages.sends_held`)."""
    name = f"tensors held by finished sends until the step's end ({sends})"
    return (Term(name, sends * ctx.boundary_bytes),) if sends else ()


def _receive_buffers_text(activations: int, gradients: int) -> str:
    """``'32 activation + 64 gradient, one per chunk-micro-batch received'``: a rank holding
    stages 0 and 2 of 4 receives no activation for stage 0 and both for stage 2; what it receives
    is not its chunk-micro-batches (64 here), so the count says what it counts."""
    kinds = [f"{n} {what}" for n, what in ((activations, "activation"), (gradients, "gradient")) if n]
    return f"{' + '.join(kinds)}, one per chunk-micro-batch received"


def _kept_logits(ctx: CostContext) -> tuple[Term, ...]:
    """The running micro-batch's logits through its loss, where the loss's own term leaves them out.

    torch's stage keeps its output (``fwd_cache``) until that micro-batch's backward, so the logits
    live beside the loss that reads them. :func:`~planc.cost.memory.logits_bytes` counts them in
    every loss but the unchunked one (one chunk, or ``whole``), whose float32 tensors replace them
    where nothing else holds them (no pipeline: freed as the loss starts, simulated).
    ``planc verify --simulate``, TP 2 x PP 2, one chunk: the last stage read -7% in fp32 without
    them (1 MiB of 14)."""
    model, b, tp, loss = ctx.model, ctx.layout.micro_batch, ctx.layout.tp, ctx.loss
    chunked = loss_in_forward(model, b, tp, loss) or loss_checkpointed(model, b, tp, loss)
    if loss not in ("chunked", "chunked_recompute", "whole") or chunked:
        return ()
    return (Term("the micro-batch's logits, kept by the stage through its loss", ctx.head_output_bytes, "loss"),)


def _waiting_micro_batches(ctx: CostContext) -> tuple[Term, ...]:
    """What the head stage's other micro-batches keep while one runs, under GPipe and zero-bubble."""
    lay, m = ctx.layout, ctx.micro_batches
    terms: tuple[Term, ...] = ()
    holding = ctx.micro_batches_holding_logits
    why = "GPipe" if lay.schedule == "gpipe" else "zero-bubble"
    if holding > 1:
        # GPipe: every forward runs before any backward, so the other micro-batches' losses wait
        # too. Zero-bubble: those in flight, or every one with a recomputed loss (the function's
        # note).
        saved = loss_saved_bytes(ctx.model, lay.micro_batch, lay.tp, ctx.compute_bytes, loss=ctx.loss)
        terms += _waiting(ctx, f"loss kept for backward ({{}}, {why})", holding - 1, saved)
    # The final norm's and head's inputs wait for the head's backward (its weight pass under
    # zero-bubble) as the blocks' activations do: the micro-batches in flight, whatever the loss.
    waiting = micro_batches_holding_logits(lay.schedule, lay.pp, m, "chunked", ctx.stage_style)
    if waiting > 1:
        saved = head_saved_bytes(
            ctx.model,
            ctx.tokens_per_microbatch,
            lay.tp,
            lay.sequence_parallel,
            ctx.residual_bytes,
            ctx.compute_bytes,
        )
        name = f"final norm's and head's inputs kept for backward ({{}}, {why})"
        terms += _waiting(ctx, name, waiting - 1, saved)
    return terms


def _waiting(ctx: CostContext, name: str, others: int, saved: float) -> tuple[Term, ...]:
    """``others`` micro-batches' ``saved`` bytes waiting beside the running one's, as ``name``
    (a format string for the count).

    Under GPipe they are the others at the first micro-batch's loss. At a later one's, after the
    first micro-batch's backward has freed its own, the running micro-batch is one of them, held
    by the loss's own terms instead: one fewer waits (simulated, TP 2 x PP 2 over FSDP, fp32: the
    last stage's peak is the second micro-batch's loss, every gradient accumulated beside 6
    other losses, not 7)."""
    if ctx.layout.schedule != "gpipe":
        return (Term(name.format(f"{others} more micro-batches"), others * saved),)
    terms = (Term(name.format(f"{others - 1} more micro-batches"), (others - 1) * saved),) if others > 1 else ()
    last = Term(name.format("1 more micro-batch, until a later one's loss"), saved, held=UNTIL_LATER_LOSS)
    return (*terms, last)


def _outputs_held(v: int, chunks: int, head: bool, turn: bool = False) -> int:
    """Chunk-micro-batches whose stage output the rank holds at its peak: every one in flight but
    the last stage's, whose output is the loss. With v > 1 the rank's last-stage chunk holds at
    most one micro-batch in flight (its backward follows its forward). At ZB-V's turn (the rank
    holding stages p - 1 and p) the first stage's outputs are the second's inputs, kept as its
    receive buffers (``set_local_fwd_input``) and counted with them: about half its chunks."""
    if v == 1:
        return 0 if head else chunks
    held = chunks - (1 if head else 0) - (chunks // 2 if turn else 0)
    return max(0, held)


def _zero_bubble_terms(ctx: CostContext, s: StageMemory) -> tuple[zero_bubble.ZeroBubbleMoment, tuple[Term, ...]]:
    """(the moment of the peak, the split backward's own terms) of a zero-bubble rank: the output
    gradients waiting for the weight pass and the input gradients kept on the received
    activations. The weight gradients at that moment are the data-parallel wrapper's to price
    (:func:`~planc.cost.data_parallel.weight_pass_gradient_bytes`: FSDP's)."""
    lay, st = ctx.layout, ctx.stage(s.rank)
    v, m = lay.virtual_stages, ctx.micro_batches
    terms: tuple[Term, ...] = ()
    # Output gradients of one chunk-micro-batch, kept between the two backward halves.
    chunk_grads = (
        st.layers
        / v
        * split_backward_output_grads(
            ctx.model, ctx.tokens_per_microbatch, lay.tp, lay.sequence_parallel, ctx.compute_bytes
        )
    )
    chunk_weights = weight_pass_gradient_bytes(ctx, s.rank)
    # Stage 0's input is token ids: torch gives it no input pass and runs its whole backward in
    # the weight pass, so nothing of it waits between the halves (simulated: the first stage of a
    # 4-layer Llama 3 8B, +6.2% -> -0.6%); zero_bubble_peaks counts it so.
    moment = _zero_bubble_peak(ctx, s, s.act_per_layer * st.layers / v, chunk_grads, chunk_weights)
    waiting = moment.waiting
    if waiting:
        name = f"output gradients kept for the weight pass ({waiting} chunk-micro-batches)"
        terms += (Term(name, waiting * chunk_grads),)
    # The input pass stores each stage input's gradient on the input itself (``inp.grad =
    # dinput``, torch's pipelining/_backward.py, stage_backward_input), and the input is that
    # micro-batch's receive buffer, which lives through the step: one boundary tensor per
    # micro-batch and stage that receives (simulated: the last of two stages grew by two
    # boundary tensors per micro-batch, one of them this, from 4 to 32 micro-batches). At ZB-V's
    # turn the second stage's input gradient is handed to the first stage on the rank as its
    # output gradient (``set_local_bwd_input``), a receive buffer already counted (simulated,
    # 2 ranks, 4 -> 16 micro-batches: both ranks grew by one boundary tensor per micro-batch
    # beyond their receive buffers).
    receiving = m * (v - st.embedding - stages.holds_turn(s.rank, lay.pp, ctx.stage_style))
    if receiving:
        name = f"input gradients kept on the received activations ({receiving} chunk-micro-batches)"
        terms += (Term(name, receiving * ctx.boundary_bytes),)
    return moment, terms


def _zero_bubble_peak(
    ctx: CostContext, s: StageMemory, activations: float, grads: float, weights: float
) -> zero_bubble.ZeroBubbleMoment:
    """The moment of the rank's peak under zero-bubble (:func:`~planc.zero_bubble.zero_bubble_moments`),
    for ``activations`` and output ``grads`` bytes per chunk-micro-batch and waiting ``weights``
    bytes per chunk, with what the data-parallel wrapper keeps of the gradients there
    (:func:`~planc.cost.data_parallel.weight_pass_moment_bytes`; the moments that differ in it
    come alone, so the usual running stage's gradients need no price here)."""
    lay = ctx.layout
    weights_wait = ctx.compute_bytes != ctx.grad_reduce_bytes  # else a weight pass adds into the accumulation
    candidates = zero_bubble.zero_bubble_moments(
        lay.pp, lay.virtual_stages, ctx.micro_batches, s.rank, ctx.stage_style, weights_wait
    )

    def held(c: zero_bubble.ZeroBubbleMoment) -> float:
        kept = moment_gradients(ctx, s.rank, c)
        return c.held * activations + c.waiting * grads + c.weights * weights - kept.absent + kept.own + kept.new

    return max(candidates, key=held)


def _bubble(ctx: CostContext) -> float:
    lay, slow = ctx.layout, ctx.slowest
    return stages.bubble_slots(
        lay.schedule,
        lay.pp,
        lay.virtual_stages,
        ctx.micro_batches,
        forward=slow.forward,
        backward=slow.backward,
        backward_weight=slow.backward_weight,
        style=ctx.stage_style,
    )


def _p2p(ctx: CostContext) -> CommCost:
    lay, prof, slow = ctx.layout, ctx.profile, ctx.slowest
    v, m = lay.virtual_stages, ctx.micro_batches
    boundary = ctx.boundary_bytes
    link = ctx.links["pp_p2p"]
    transfer = _hop_seconds(ctx, link)
    # The warm-up and cool-down run one micro-batch over every hop in turn, each at its own link.
    path = sum(count * _hop_seconds(ctx, hop) for hop, count in ctx.links["pp_hop_counts"])
    # The busiest pair of neighbouring ranks: every micro-batch's activation one way and its
    # gradient back at each stage boundary between them -- v per pair, or 2 v - 1 with pp = 2,
    # where the wrap from the last rank to the first joins the same two ranks.
    transfers = 2 * m * stages.busiest_rank_pair_boundaries(lay.pp, v, ctx.stage_style)
    total = transfers * transfer
    if prof.pp_p2p_blocking:
        exposed = total
    else:
        # In the steady state the slowest boundary paces every micro-batch that crosses it.
        chunk_slot = min(slow.forward, slow.backward) / v
        exposed = min(total, 2 * path + transfers * max(0.0, transfer - chunk_slot))
    per_boundary = 2 * m * boundary  # each micro-batch's activation one way, its gradient back
    by_rank = tuple(
        per_boundary * stages.rank_boundaries(st.rank, lay.pp, v, ctx.stage_style) for st in ctx.stages_by_pp_rank
    )
    return CommCost(
        "pp",
        volume_by_pp_rank=by_rank,
        volume=transfers * boundary,
        total=total,
        exposed=exposed,
        medium=link.medium,
        detail=(
            f"{transfers} p2p transfers of {format_bytes(boundary)} per step between the busiest pair of "
            f"neighbouring ranks ({transfers // 2} each way)"
        ),
    )


def _with_step_reductions(ctx: CostContext, p2p: CommCost) -> CommCost:
    """``p2p`` and the all-reduces a pipelined step runs between its schedule and its optimizer, each
    waited on before the next (exposed): the sum of the stages' squared gradient norms over the
    pipeline group (planc.runtime.grad_norm.grad_norm; Megatron sums its norm over the model-parallel
    group the same way), and with tied embeddings the sum of the first stage's embedding gradient
    and the last stage's output gradient over those two ranks (planc.runtime.step._sum_tied_gradients;
    Megatron-LM's ``allreduce_word_embedding_grads``), every element of a tensor-parallel rank's
    vocabulary shard, in the gradients' reduction precision -- its FSDP shard under ZeRO-2/3, whose
    gradients are sharded by then."""
    seconds, volume = norm_reductions(1, ctx.links["pp"])
    detail = p2p.detail + ", an all-reduce of the gradient norm"
    by_rank = tuple(v + volume for v in p2p.volume_by_pp_rank)
    tied = tied_gradient_bytes(ctx)
    if tied:
        ends = ctx.links["pp_ends"]
        seconds += all_reduce_seconds(tied, ends)
        tied_volume = 2 * (ends.size - 1) / ends.size * tied
        volume += tied_volume
        # on the ranks that hold the embedding or the head
        stages_in_order = ctx.stages_by_pp_rank
        by_rank = tuple(
            v + tied_volume * (st.embedding or st.head) for v, st in zip(by_rank, stages_in_order, strict=True)
        )
        detail += f" and of the tied embedding's {format_bytes(tied)} gradient (first and last stage)"
    return replace(
        p2p,
        volume=p2p.volume + volume,
        total=p2p.total + seconds,
        exposed=p2p.exposed + seconds,
        detail=detail,
        volume_by_pp_rank=by_rank,
    )


def tied_gradient_bytes(ctx: CostContext) -> float:
    """Bytes of the tied embedding gradient one rank sums with the other end of the pipeline (0 when
    the embeddings are not tied)."""
    model, lay = ctx.model, ctx.layout
    if not model.tie_embeddings or lay.pp == 1:
        return 0.0
    elements = model.padded_vocab * model.hidden / lay.tp
    if lay.zero >= 2:
        elements /= lay.shard_degree
    return float(elements * ctx.grad_reduce_bytes)


def _hop_seconds(ctx: CostContext, link: GroupLink) -> float:
    """One boundary tensor over one hop between pipeline stages (none at ZB-V's turn, on its rank)."""
    lay, boundary = ctx.layout, ctx.boundary_bytes
    if link.size <= 1:
        return 0.0
    seconds = p2p_seconds(boundary, link)
    if ctx.profile.p2p_scatter_gather and lay.tp > 1 and not lay.sequence_parallel:
        seconds += all_gather_seconds(boundary * lay.tp, ctx.links["tp"])  # re-assemble in the node
    return seconds
