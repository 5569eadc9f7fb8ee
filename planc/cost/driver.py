"""The cost model's driver: base terms, then each strategy's pass, then the fixed overheads.

    estimate = finalize(ctx, pass_n(... pass_1(ctx, base_estimate(ctx)) ...))

:func:`base_estimate` holds what every program pays, layout or not: the model states of one
rank's parameters (replicated), the activations of one micro-batch without recomputation, the
compute of all micro-batches, the optimizer step. The strategies' passes (each strategy
package's ``cost``, built-in or plugin) add their own terms in composition order; the cost
model is handed them (:class:`~planc.cost.estimate.Passes`) and never looks strategies up.
:func:`finalize` adds the runtime's fixed memory and the allocator margin, and prices the
pipeline bubble from the final micro-batch time.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from planc.cost.block_backward import block_backward_terms
from planc.cost.context import ContextCache, CostContext, build_context
from planc.cost.estimate import PHASES_JOINED, CostPass, Estimate, Passes, StageMemory, Term
from planc.cost.flops import hardware_flops_per_step, model_flops_per_step
from planc.cost.memory import (
    ALLOCATOR_MARGIN,
    DEVICE_RUNTIME_OVERHEAD,
    head_saved_bytes,
    model_state_bytes,
)
from planc.cost.optimizer_step import step_seconds
from planc.cost.params import StageParams, embedding_params_per_shard, head_params_per_shard
from planc.cost.profile import PLANC_RUNTIME, RuntimeProfile
from planc.spec.layout import Layout
from planc.spec.plan import Plan


@lru_cache(maxsize=64)
def _flops(model, tokens: int, recompute: str, attention: str = "flash") -> float:
    if recompute == "none":
        return model_flops_per_step(model, tokens)
    return hardware_flops_per_step(model, tokens, recompute, attention)


def head_params(ctx: CostContext, st: StageParams) -> int:
    """Parameters of the final norm and output head on one device of ``st`` (0 off the last stage)."""
    return head_params_per_shard(ctx.model, ctx.layout.tp, ctx.layout.pp) if st.head else 0


def embedding_params(ctx: CostContext, st: StageParams) -> int:
    """Parameters of the token embedding (and learned positions) on one device of ``st`` (0 off the first stage)."""
    return embedding_params_per_shard(ctx.model, ctx.layout.tp) if st.embedding else 0


#: The phases that hold the final norm's and head's saved inputs of the micro-batch in flight.
HEAD_SAVED_PHASES = ("forward", "loss", "head backward")


def _head_terms(ctx: CostContext) -> tuple[Term, ...]:
    """What the head stage holds for one micro-batch beside its blocks, by phase."""
    lay, tokens = ctx.layout, ctx.tokens_per_microbatch
    saved = head_saved_bytes(ctx.model, tokens, lay.tp, lay.sequence_parallel, ctx.residual_bytes, ctx.compute_bytes)
    return (
        Term("logits and loss (1 micro-batch)", ctx.logits, "loss"),
        # The forward's end, as the head's GEMM writes them: other programs' terms join this
        # phase (autocast's cached weight copies, a pipeline's previous logits).
        Term("logits as the head's forward writes them", ctx.head_output_bytes, "forward"),
        # From the head's forward to its backward; a block's backward comes after the head's.
        Term("final norm's and output head's saved inputs", saved, PHASES_JOINED.join(HEAD_SAVED_PHASES)),
        # The loss's backward has freed the rest of its tensors (simulated; FSDP's terms and
        # autocast's join this phase with what the head's backward gathers and writes).
        Term("the logits' gradient, at the head's backward", ctx.head_output_bytes, "head backward"),
    )


#: The step's loss, stop votes and peak memory gathered over every rank (planc.runtime.step_summary).
SUMMARY_NAME = "step summary over every rank"


def base_estimate(ctx: CostContext) -> Estimate:
    """The terms of a program with no strategy: one device's share, one micro-batch at a time."""
    stages = []
    for st in ctx.stages:
        states = model_state_bytes(st.params, 1, 0, ctx.state_bytes)
        grad_per_param = states.grads / st.params if st.params else 0.0
        extra = _head_terms(ctx) if st.head else ()
        stages.append(
            StageMemory(
                rank=st.rank,
                params=states.params,
                master=states.master,
                grads=states.grads,
                optimizer=states.optimizer,
                act_per_layer=ctx.layer_act.none,
                act_layers=float(st.layers),
                act_extra=extra,
                # One micro-batch per step: its forward runs before any backward, with no gradients
                # yet (the pipeline pass decides this for its schedules; DDP's buckets undo it).
                first_backward_frees=float(st.layers) if ctx.micro_batches == 1 else 0.0,
                transient=block_backward_terms(ctx, st),
                head_grads=grad_per_param * head_params(ctx, st),
                embedding_grads=grad_per_param * embedding_params(ctx, st),
            )
        )
    slow = ctx.slowest
    m = ctx.micro_batches
    plan, model = ctx.plan, ctx.model
    tokens = plan.tokens_per_step
    summary = ctx.summary_seconds
    return Estimate(
        stages=tuple(stages),
        compute=m * (slow.forward + slow.backward),
        optimizer=step_seconds(ctx),
        micro_batches=m,
        capacity=ctx.capacity,
        world_size=plan.world_size,
        tokens_per_step=tokens,
        model_flops=_flops(model, tokens, "none"),
        hardware_flops=_flops(model, tokens, ctx.layout.recompute, ctx.profile.attention),
        peak=ctx.device.peak,
        stage_style=ctx.stage_style,
        host_bound=ctx.layer.host_bound,
        other=(Term(SUMMARY_NAME, summary),) if summary > 0 else (),
    )


_MARGIN_NAME = f"allocator margin ({ALLOCATOR_MARGIN:.0%})"
_RUNTIME_NAME = "CUDA context and library workspaces"


def finalize(ctx: CostContext, est: Estimate) -> Estimate:
    """Fixed memory terms and the bubble in seconds.

    The bubble is ``bubble_slots`` micro-batch slots, a slot being one micro-batch's compute
    plus its exposed tensor-parallel communication and its host work (:meth:`Estimate.slot_seconds`:
    all of them scale with the micro-batch count).
    """
    tp = est.comm_of("tp")
    slot = est.slot_seconds(tp.exposed if tp else 0.0)
    fixed = 0.0 if ctx.plan.hardware.is_cpu else DEVICE_RUNTIME_OVERHEAD

    stages, peak = [], 0.0
    for s in est.stages:
        terms = (Term(_RUNTIME_NAME, fixed),) if fixed else ()
        before = s.total + fixed
        margin = Term(_MARGIN_NAME, ALLOCATOR_MARGIN * before)
        stages.append(s.updated(transient=terms + (margin,)))
        # Both terms are held at every moment of the step, so they move no peak: the new total is
        # the old one plus them (the planner finalizes every layout it scores; no second _peak).
        peak = max(peak, before + margin.value)
    return est.replace(stages=tuple(stages), bubble=est.bubble_slots * slot, peak_memory=peak)


def run_passes(ctx: CostContext, passes: Iterable[CostPass]) -> Estimate:
    """Base terms, every pass in order, then :func:`finalize`."""
    est = base_estimate(ctx)
    for p in passes:
        est = p.cost(ctx, est, p.options)
    return finalize(ctx, est)


def evaluate(
    plan: Plan,
    layout: Layout,
    passes: Passes,
    *,
    profile: RuntimeProfile = PLANC_RUNTIME,
    cache: ContextCache | None = None,
) -> Estimate:
    """Predict memory per device and time per step of ``layout`` for ``plan`` under ``passes``
    (the strategies active for the layout: ``registry.passes(plan, layout)``; add your own to
    try a plugin's term)."""
    ctx = build_context(plan, layout, profile, cache, passes.stage_style)
    return run_passes(ctx, passes)
