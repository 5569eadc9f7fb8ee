"""What the cost model predicts for each quantity ``planc verify`` measures, per pipeline rank.

Pure and torch-free: the :class:`~planc.cost.context.CostContext` and the
:class:`~planc.cost.estimate.Estimate` of the plan's chosen layout, read the way the probe
measures (:mod:`planc.verify.probe`):

- model states as they persist between steps: the parameters this rank stores (under FSDP the
  sharded fp32 copy, the cost model's ``master``; its working copy exists only while a unit is
  gathered), the gradients and the optimizer states;
- saved activations of one micro-batch through one model chunk: blocks x bytes per block (the
  cost model's per-block term; embedding, final norm and head are not a separate term there);
- each group's communication volume per step (:class:`~planc.cost.estimate.CommCost`);
- the rank's peak (its :class:`~planc.cost.estimate.StageMemory` total) and the step time.
"""

from __future__ import annotations

from planc.cost.context import CostContext
from planc.cost.estimate import Estimate, StageMemory
from planc.cost.params import StageParams
from planc.cost.zero_partition import partitioned_by_tensor, with_zero1_share, zero1_state_elements

#: Terms a simulation on fake tensors cannot see (planc.cost.driver.finalize adds them last).
UNSIMULATED_TERMS = ("CUDA context and library workspaces", "allocator margin")

#: What verify's predicted peak is, wherever it is shown beside explain's total (which holds both
#: terms): the figure comparable to what a tracker or ``max_memory_allocated`` counts (docs/gpu.md).
PEAK_NET_WORDS = "net of the allocator margin and CUDA context, as the allocator counts"


def estimate_for(plan, layout, registry) -> tuple[CostContext, Estimate]:
    """The cost model's context and estimate for ``plan`` under ``layout`` (what explain shows),
    with every pipeline rank's stage (explain's are the ranks that bound the others)."""
    from planc.cost.context import ContextCache, build_context
    from planc.cost.driver import run_passes

    passes = registry.passes(plan, layout)
    cache = ContextCache(plan, every_rank=True)
    ctx = build_context(plan, layout, cache.profile, cache, passes.stage_style)
    return ctx, run_passes(ctx, passes)


def peak_net_bytes(memory: StageMemory) -> float:
    """The stage's predicted peak without the terms no fake-tensor simulation holds: the CUDA
    context and library workspaces, and the caching allocator's margin."""
    return memory.total - _terms(memory, UNSIMULATED_TERMS)


def _terms(memory: StageMemory, names: tuple[str, ...]) -> float:
    """Bytes of the stage's transient terms whose names start with one of ``names``."""
    return sum(t.value for t in memory.transient if t.name.startswith(names))


def stage_for(
    ctx: CostContext, est: Estimate, pp_rank: int, dp_rank: int | None = None
) -> tuple[StageMemory, StageParams]:
    """The stage (memory, parameters) of pipeline rank ``pp_rank``: itself when the estimate holds
    it (:func:`estimate_for`'s hold every rank), else the second stage, which bounds every middle
    rank (a middle rank of PP 4 1F1B holds a micro-batch fewer in flight than the second: +18 %
    when verify read it against the second stage). Under torch's ZeRO-1 the stage's memory holds
    its most loaded data-parallel rank's optimizer states; given ``dp_rank``, that rank's own
    (:mod:`planc.cost.zero_partition`)."""
    ranks = [s.rank for s in est.stages]
    rank = pp_rank if pp_rank in ranks else (ranks[1] if len(ranks) > 2 else ranks[-1])
    memory = next(s for s in est.stages if s.rank == rank)
    if dp_rank is not None and partitioned_by_tensor(ctx):
        memory = with_zero1_share(ctx, memory, zero1_state_elements(ctx, rank)[dp_rank])
    return memory, ctx.stage(rank)


def stored_params_name(memory: StageMemory) -> str:
    """The name of the parameters a rank stores, as explain's memory table names their row: the fp32
    master copy where the layout keeps one (the program's parameters are fp32; the bf16 working copy
    is made per op or per gathered unit), else the parameters themselves."""
    return "master weights (fp32)" if memory.master else "params"


def predicted_for_rank(ctx: CostContext, est: Estimate, pp_rank: int, dp_rank: int | None = None) -> dict:
    """The numbers :mod:`planc.verify.report` holds against one rank's measurements (bytes, seconds)."""
    memory, params = stage_for(ctx, est, pp_rank, dp_rank)
    v = ctx.layout.virtual_stages
    stored = memory.master if memory.master else memory.params
    blocks_per_chunk = params.layers / v
    per_block = ctx.layer_act.under(ctx.layout.recompute)
    return {
        "model_states": {"params": stored, "grads": memory.grads, "optimizer": memory.optimizer},
        "params_name": stored_params_name(memory),
        "activations": {"per_block_bytes": per_block, "blocks_bytes": per_block * blocks_per_chunk},
        "comm": {c.group: c.volume_of_pp_rank(pp_rank) for c in est.comm},
        "peak_bytes": memory.total,
        "peak_net_bytes": peak_net_bytes(memory),
        "context_bytes": _terms(memory, UNSIMULATED_TERMS[:1]),
        "step_s": est.step_s,
        "step_parts": est.step_parts(),
    }
