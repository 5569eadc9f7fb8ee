"""What every data-parallel cost pass shares: the bucketed gradient all-reduce, ZeRO's sharding of
the model states, and the compute that overlapped traffic takes away.

Used by the built-in ``ddp``, ``zero1`` and ``fsdp`` passes; a plugin that changes data
parallelism (a compression hook, an offload) may use them too. Pure functions of the
:class:`~planc.cost.context.CostContext`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

from planc.cost.comm import all_reduce_seconds
from planc.cost.compute import overlap_contention
from planc.cost.context import CostContext
from planc.cost.estimate import CommCost, Estimate, StageMemory, Term
from planc.cost.memory import DDP_BUCKET_BYTES, model_state_bytes
from planc.cost.optimizer_step import step_seconds
from planc.cost.params import embedding_params_per_shard, first_chunks_params, mlp_params_per_shard
from planc.cost.wrappers import tensors_per_rank
from planc.cost.zero_partition import partitioned_by_tensor, zero1_busiest_share
from planc.stages import backwards_stage_by_stage
from planc.zero_bubble import ZeroBubbleMoment


def weight_pass_gradient_bytes(ctx: CostContext, rank: int) -> float:
    """Bytes of one of ``rank``'s pipeline stages' weight gradients that wait for the stage's next
    input pass under a zero-bubble schedule: its blocks' parameters (per device) in compute precision.

    FSDP2 (ZeRO-2 over ``dp`` > 1, the only data parallelism zero-bubble runs with; ZeRO-3's
    hooks alike) hangs its post-backward hook on each unit's forward inputs
    (``RegisterPostBackwardFunction``), so the hook fires in the split backward's *input* pass.
    The weight pass then writes the unit's gradients into the unsharded parameters' ``.grad`` in
    compute precision, where they stay until the same unit's next input pass, whose hook adds them
    into the fp32 accumulated ones (``accumulate_unsharded_grad_if_needed``): ``compute_bytes``
    per parameter beside the accumulated ``grad_reduce_bytes``. With equal dtypes (fp32) autograd
    adds them into the accumulated ``.grad`` itself: nothing waits. Without FSDP the gradients go
    to ``.grad`` where they stay (the model states). The first stage is not one of them: torch
    runs its whole backward in the weight pass (its input is token ids), hook included
    (:func:`planc.zero_bubble.zero_bubble_peaks` counts the stages). ``planc verify --simulate`` of a
    Llama 3 70B plan cut to 40 layers (TP 8 x PP 4, v = 2, 16 micro-batches): at the middle
    stage's peak, its other stage's five blocks' gradients in bf16, 1.0 GiB, all the gap."""
    lay, st = ctx.layout, ctx.stage(rank)
    if not _weight_pass_gradients_wait(ctx):
        return 0.0
    return ctx.compute_bytes * st.layers / lay.virtual_stages * st.layer_params


def _weight_pass_gradients_wait(ctx: CostContext) -> bool:
    """Whether FSDP keeps weight-pass gradients apart from the accumulated ones
    (:func:`weight_pass_gradient_bytes`): ZeRO-2 or 3 over dp > 1, compute and reduce dtypes unequal."""
    lay = ctx.layout
    return lay.zero >= 2 and lay.dp > 1 and ctx.compute_bytes != ctx.grad_reduce_bytes


def weight_pass_moment_bytes(ctx: CostContext, rank: int) -> tuple[float, float, float]:
    """(fp32 accumulated bytes of one of ``rank``'s stages, bytes of the running stage's own
    gradients in compute precision, bytes of a weight pass's new gradients) where a zero-bubble
    moment differs from FSDP's usual one (:class:`planc.zero_bubble.ZeroBubbleMoment`): a stage whose
    weight gradients wait for the first time has no fp32 accumulation yet (``grad_reduce_bytes``
    per parameter of its blocks); the running stage's gradients from its earlier weight passes
    are its blocks' and the root unit's in compute precision; and ``stage_backward_weight`` takes
    one parameter group's gradients at a time, holding them beside ``.grad`` until it adds them --
    the MLP's, the largest group. ``planc verify --simulate`` (hidden 512, ffn 2048): the MLP's
    two matrices' 4 MiB beside the stage's earlier 6.5 MiB at the last rank's peak. In fp32 a
    weight pass writes into the accumulation itself (autograd's ``AccumulateGrad`` into the
    unsharded ``.grad``): the accumulation alone, nothing apart. Zero without FSDP."""
    lay = ctx.layout
    if lay.zero < 2 or lay.dp == 1:
        return 0.0, 0.0, 0.0
    st, v, e = ctx.stage(rank), lay.virtual_stages, ctx.compute_bytes
    blocks = st.layers / v * st.layer_params
    if not _weight_pass_gradients_wait(ctx):
        return ctx.grad_reduce_bytes * blocks, 0.0, 0.0
    root = st.params - st.layers * st.layer_params
    return ctx.grad_reduce_bytes * blocks, e * (blocks + root), e * mlp_params_per_shard(ctx.model, lay.tp)


def interleaved_gradient_params(ctx: CostContext, rank: int, without: int) -> tuple[int, int]:
    """(parameters of ``rank`` that hold no gradient, parameters whose gradients torch has reduced)
    at an interleaved rank's moment where its first ``without`` stages have not begun their
    backward (:func:`planc.stages.interleaved_peaks`, ``StageMemory.stages_without_grads``). With
    one round of micro-batches the rank runs its stages' backwards one stage after another, so
    every stage after the running one has run all of its, and ``REDUCE_GRAD`` right after a
    stage's last backward has reduced it (``perform_reduce_grad``): what a wrapper that reduces
    once per stage and step (FSDP under a pipeline) then holds is the sharded gradients in place
    of the unsharded accumulation -- of the rank's last stages, the head's among them. With two
    rounds and more the peak finds every stage accumulating: (0, 0)."""
    lay, st = ctx.layout, ctx.stage(rank)
    if not backwards_stage_by_stage(lay.schedule, lay.pp, ctx.micro_batches):
        return 0, 0
    absent = first_chunks_params(ctx.model, lay.tp, st, without)
    return absent, st.params - first_chunks_params(ctx.model, lay.tp, st, without + 1)


def interleaved_gradient_bytes(ctx: CostContext, rank: int, without: int) -> float:
    """Gradient bytes ``rank`` holds at an interleaved moment where its first ``without`` stages
    have not begun their backward (:func:`interleaved_gradient_params`), by data parallelism:
    FSDP (ZeRO-2/3) its running stage's fp32 accumulation and the done stages' sharded gradients
    (its whole-vocabulary embedding gradient aside); DDP's buckets every gradient, made or not;
    else (no data parallelism) every begun stage's ``.grad``, which stays to the step's end. The
    pipeline pass weighs the moments with it: priced as ``.grad``, a Llama 3 405B plan (TP 8 x
    PP 4 x DP 512, v = 4, 4 micro-batches) put the peak at the last stage's backwards, with every
    stage's gradients, where FSDP holds one stage's accumulation and three stages' shards."""
    lay, st = ctx.layout, ctx.stage(rank)
    absent, reduced = interleaved_gradient_params(ctx, rank, without)
    if lay.dp > 1 and lay.zero >= 2:
        return ctx.grad_reduce_bytes * (st.params - absent - reduced + reduced / lay.shard_degree)
    return ctx.state_bytes.grads * (st.params - (absent if lay.dp == 1 else 0))


def gained_by_the_embedding_backward(ctx: CostContext, s: StageMemory) -> float:
    """Gradient bytes FSDP holds at rank 0's first embedding backward beyond those at its peak,
    where the embedding's stage had not begun (``stages_without_grads``; one round of interleaved
    micro-batches): the first stage's fp32 accumulation, its embedding's own rows' included, and
    the later stages' shards, for the running stage's accumulation at the peak -- less, under
    ZeRO-2, the later stages' parameters their reduction resharded. Simulated (Llama 3 70B cut to
    16 layers, TP 8 x PP 4 x DP 2, v = 2, 4 micro-batches): rank 0 peaks there, -3.6 % without
    the embedding's own rows' 0.5 GB of fp32 accumulation, +0.4 % with them."""
    if not (ctx.stage(s.rank).embedding and s.stages_without_grads):
        return 0.0
    reduced = interleaved_gradient_params(ctx, s.rank, 0)[1]
    resharded = ctx.compute_bytes * reduced if ctx.layout.zero == 2 else 0.0
    at_peak = interleaved_gradient_bytes(ctx, s.rank, s.stages_without_grads)
    return interleaved_gradient_bytes(ctx, s.rank, 0) - at_peak - resharded


def backwarded_layers(ctx: CostContext, s: StageMemory) -> int:
    """Blocks of ``s``'s rank gathered by a backward and not resharded by a reduction at its peak,
    for FSDP's ZeRO-3 under a pipeline: with one round of interleaved micro-batches the running
    stage's alone (:func:`interleaved_gradient_params`; simulated, PP 2 x ZeRO-3 x DP 2, v = 2, 2
    micro-batches: +9.3 / +6.5 % with every stage's, +0.6 / -2.4 % since); else every block."""
    st = ctx.stage(s.rank)
    if backwards_stage_by_stage(ctx.layout.schedule, ctx.layout.pp, ctx.micro_batches):
        return st.chunk_layers[s.stages_without_grads]
    return st.layers


def embedding_accumulated_at_peak(ctx: CostContext, s: StageMemory) -> bool:
    """Whether the whole-vocabulary embedding gradient a wrapper that reduces once per step
    accumulates is held at ``s``'s peak: a backward comes before it (not ``first_backward_frees``),
    and the embedding's stage's among them (not one of ``stages_without_grads``)."""
    return not s.first_backward_frees and not (ctx.stage(s.rank).embedding and s.stages_without_grads)


class MomentGradients(NamedTuple):
    """What FSDP keeps of a rank's gradients at a zero-bubble moment (:func:`moment_gradients`)."""

    absent: float
    """Bytes of FSDP's usual gradients and gathered parameters not held there."""
    own: float
    """Bytes of the running stage's gradients from its earlier weight passes, in compute precision."""
    new: float
    """Bytes of the running weight pass's new parameter group's gradients."""
    resharded: float = 0.0
    """Of ``absent``, the gathered parameters: those of the stages already reduced, which the
    working copy counts gathered (the rest is gradients)."""


def moment_gradients(ctx: CostContext, rank: int, moment: ZeroBubbleMoment) -> MomentGradients:
    """What FSDP keeps of ``rank``'s gradients at a zero-bubble ``moment``, against its usual --
    every stage's fp32 accumulation beside the gathered parameters, what two rounds of
    micro-batches and more hold from the first weight pass on (:func:`weight_pass_moment_bytes`
    prices one stage's blocks):

    - absent: the fp32 accumulations of the stages that have none yet, and for each stage
      already reduced (``perform_reduce_grad`` reshards it) its unsharded accumulation less its
      sharded gradients, and its gathered blocks;
    - own (where the moment holds them): the running stage's blocks' gradients from its earlier
      weight passes, in compute precision;
    - new (in a weight pass): the running parameter group's (the first stage's: a block's, its
      whole backward running there).

    A root unit (the embedding on the first stage, the head on the last; both on ZB-V's rank 0)
    goes with its stage: with one round (looped) or fewer micro-batches than the V is planned for
    the rank's stages finish their backwards in order, the head's stage first and the
    embedding's last (:class:`~planc.zero_bubble.ZeroBubbleMoment`: ``reduced`` of them done, the next
    ``accumulations`` accumulating), so a root is reduced, accumulating or not there yet with its
    stage. ``planc verify --simulate``, PP 4 x DP 2, v = 2, 4 micro-batches (one round): at rank
    0's peak stage 4's accumulation alone, 12 MiB of the 25 priced before; at the last rank's
    (7W1) none, its head's included, stage 7's input passes all done before its weight passes;
    ZB-V's rank 0 (7I3) the head stage's accumulation, the head's included, and none of the
    embedding's stage. Zero where FSDP keeps no weight-pass gradients apart."""
    accumulated, own, new = weight_pass_moment_bytes(ctx, rank)
    if not accumulated:
        return MomentGradients(0.0, 0.0, 0.0)
    lay, st, e, g = ctx.layout, ctx.stage(rank), ctx.compute_bytes, ctx.grad_reduce_bytes
    v, shards = lay.virtual_stages, lay.shard_degree
    if moment.accumulations is None:  # two rounds and more, or the whole V: nothing reduced, roots accumulating
        absent = moment.first_waits * accumulated
        return MomentGradients(absent, _running(moment, own), _in_weight_pass(moment, new))
    # A reduced stage holds its sharded gradients, not its accumulation, and its blocks resharded.
    blocks = e * st.layers / v * st.layer_params
    resharded = moment.reduced * blocks
    absent = (v - moment.accumulations - moment.reduced) * accumulated
    absent += moment.reduced * (accumulated - accumulated / shards) + resharded
    running = moment.reduced if moment.running is None else moment.running
    for part, order in _root_units(ctx, rank):
        if order < moment.reduced:
            absent += g * part - g * part / shards + e * part
            resharded += e * part
        elif order >= moment.reduced + moment.accumulations:  # no accumulation yet
            absent += g * part
        if order != running and own:
            own -= e * part
    if st.embedding and running == v - 1 and _weight_pass_gradients_wait(ctx):
        # The first stage's weight pass is its whole backward, FSDP's hook included: a block's
        # gradients exist in compute precision until its hook adds them, as in any backward.
        new = e * st.layer_params
    return MomentGradients(absent, _running(moment, own), _in_weight_pass(moment, new), resharded)


def _root_units(ctx: CostContext, rank: int) -> tuple[tuple[float, int], ...]:
    """(parameters, place in the order the rank's stages finish their backwards) of the root units
    on ``rank``: the head's stage finishes first (0), the embedding's last (v - 1) -- the looped
    schedules' last and first stage, ZB-V rank 0's second and first."""
    st, v = ctx.stage(rank), ctx.layout.virtual_stages
    root = st.params - st.layers * st.layer_params
    embedding = embedding_params_per_shard(ctx.model, ctx.layout.tp) if st.embedding else 0
    units = ((root - embedding, 0), (embedding, v - 1)) if st.head else ((root, v - 1),)
    return tuple(unit for unit in units if unit[0])


def _running(moment: ZeroBubbleMoment, own: float) -> float:
    """The running stage's own gradients where the moment holds them."""
    return own if moment.running_grads and (moment.weight_pass or moment.input_pass) else 0.0


def _in_weight_pass(moment: ZeroBubbleMoment, new: float) -> float:
    """A weight pass's new gradients, at a moment in one."""
    return new if moment.weight_pass else 0.0


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
    keeps_first_backward: bool = False,
) -> Estimate:
    """Shard the model states over the dp ranks (ZeRO stage ``zero``), add ``buffers(stage)``
    and the data-parallel traffic ``comm``. With HSDP the states are sharded over the shard group
    only (each replica holds a full set).

    The wrapper's buffer terms price its gradients (unsharded, accumulated, root unit) with
    their own lifetimes, so the gradients are held throughout -- unless ``keeps_first_backward``:
    the buffers then say which of their bytes exist only from the first backward on
    (:data:`~planc.cost.estimate.FROM_FIRST_BACKWARD`) and the stage's
    ``first_backward_frees`` stays."""
    n_d = ctx.layout.shard_degree

    def shard(s: StageMemory) -> StageMemory:
        states = model_state_bytes(ctx.stage(s.rank).params, n_d, zero, ctx.state_bytes)
        share = states.grads / s.grads if s.grads else 0.0  # the head's and embedding's, as every one
        return s.updated(
            params=states.params,
            master=states.master,
            grads=states.grads,
            optimizer=states.optimizer,
            transient=buffers(s),
            first_backward_frees=s.first_backward_frees if keeps_first_backward else 0.0,
            stages_without_grads=s.stages_without_grads if keeps_first_backward else 0,
            absent_grads=s.absent_grads * share if keeps_first_backward else 0.0,
            head_grads=s.head_grads * share,
            embedding_grads=s.embedding_grads * share,
        )

    return est.updated(stage_fn=shard, comm=comm, optimizer=step_seconds(ctx, stepped_share(ctx, n_d)))


def stepped_share(ctx: CostContext, n_d: int) -> tuple[float, float]:
    """(parameters, tensors) the busiest rank's optimizer steps with its states sharded over ``n_d``
    ranks: torch's ZeRO-1 deals each tensor whole to one rank, and the step lasts as long as the
    most loaded rank's (:func:`~planc.cost.zero_partition.zero1_busiest_share`); FSDP's ranks, and
    the flat buffers of other runtimes, each step 1 / n_d of every tensor."""
    if partitioned_by_tensor(ctx):
        return zero1_busiest_share(ctx)
    return max(st.params for st in ctx.stages) / n_d, tensors_per_rank(ctx)


def by_pp_rank(ctx: CostContext, proportional: float, fixed: float = 0.0) -> tuple[float, ...]:
    """Each pipeline rank's data-parallel bytes where the context holds every rank's stage (planc
    verify's estimate; else ``()``): ``proportional`` bytes for the busiest stage's parameters,
    scaled to each stage's own (gradients reduced and parameters gathered are the stage's), plus
    ``fixed`` bytes every rank moves (the gradient norm's all-reduce). A lighter stage read +1.8 %
    against the busiest's volume (PP 2 x ZeRO-2 x DP 2, interleaved)."""
    busiest = max(st.params for st in ctx.stages)
    return tuple(proportional * st.params / busiest + fixed for st in ctx.stages_by_pp_rank)
