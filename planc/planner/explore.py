"""Score every legal layout of a plan, pruning what cannot fit or cannot win.

Pruning, each rule sound under the cost model:

1. **Model states first.** For each (tp, pp, dp, zero) the model states of the fullest pipeline
   rank are a lower bound on its memory; if they alone exceed the device, no recomputation,
   schedule or micro-batch can help, and none is scored (the bound is kept per rung for
   ``explain``).
2. **The least memory-hungry member first.** For each (tp, pp, dp, zero) one layout — full
   recomputation, sequence parallel, the smallest micro-batch, 1F1B — is scored first (under
   FSDP also the largest micro-batch, which needs no gradient accumulation); if none fits, no
   member of the family does.
3. **Micro-batches ascending, stop at the first misfit.** Activations grow with the
   micro-batch, so a larger one cannot fit where a smaller one did not (except, under FSDP,
   the single micro-batch per step, which is tried on its own). The loop also stops
   once throughput falls 10% below the best seen for the configuration (the micro-batch has
   passed its best: GEMM efficiency saturates while the bubble and the memory keep growing) —
   a heuristic, stated.
4. **Recompute only where needed.** At a micro-batch where less recomputation already fits,
   more recomputation costs time and buys nothing: it is not scored (the rung is marked
   "dominated").
5. **GPipe** only when asked for (see :mod:`planc.legality`).

Every scored layout is a :class:`Candidate`. One :class:`~planc.cost.ContextCache` serves the
whole search, so group links, stage splits and block times are computed once each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from planc.cost.context import ContextCache
from planc.cost.driver import evaluate
from planc.cost.estimate import Estimate
from planc.cost.memory import DEVICE_RUNTIME_OVERHEAD, model_state_bytes, runtime_state_bytes
from planc.cost.profile import PLANC_RUNTIME, RuntimeProfile
from planc.legality import space
from planc.planner.ladder import complexity, rung_for
from planc.spec.layout import Layout
from planc.spec.plan import Plan

if TYPE_CHECKING:
    from planc.strategies.registry import Registry

#: The micro-batch loop stops once throughput falls below this fraction of the best seen for the
#: configuration. Not at the first dip: wave quantization makes throughput ripple with the
#: micro-batch (a heuristic, stated; see the module docstring).
PAST_THE_BEST = 0.9


@dataclass(frozen=True, slots=True)
class Candidate:
    """One scored layout."""

    layout: Layout
    estimate: Estimate
    complexity: tuple

    @property
    def rung(self) -> int:
        return self.complexity[0]

    @property
    def fits(self) -> bool:
        return self.estimate.fits

    @property
    def tokens_per_s(self) -> float:
        return self.estimate.tokens_per_s


@dataclass
class SearchResult:
    """What the search found."""

    fitting: list[Candidate] = field(default_factory=list)
    """Every scored layout that fits."""
    tightest_misfit: dict[int, Candidate] = field(default_factory=dict)
    """Per rung, the scored layout that missed by the least memory."""
    family_bound: dict[int, Candidate] = field(default_factory=dict)
    """Per rung, the least memory of a family ruled out by its least hungry member (a lower
    bound for every layout of the family on that rung)."""
    states_bound: dict[int, tuple[float, Layout]] = field(default_factory=dict)
    """Per rung, the smallest model-states lower bound of a pruned (tp, pp, dp, zero)."""
    refused: dict[int, str] = field(default_factory=dict)
    """Per rung, why a strategy named in a ``use`` block refused its layouts (they are not scored)."""
    dominated: set[int] = field(default_factory=set)
    """Rungs whose layouts were skipped because a simpler one fits at the same micro-batch."""
    scored: int = 0
    seconds: float = 0.0


def make_layout(
    tp: int, pp: int, dp: int, zero: int, recompute: str, schedule: str | None, micro_batch: int, v: int, sp: bool
) -> Layout:
    """A Layout without re-validation (the search only builds consistent ones)."""
    return Layout.model_construct(
        tp=tp,
        pp=pp,
        dp=dp,
        zero=zero,
        recompute=recompute,
        schedule=schedule,
        micro_batch=micro_batch,
        virtual_stages=v,
        sequence_parallel=sp,
    )


def evaluate_layout(plan: Plan, layout: Layout, registry: Registry, cache: ContextCache) -> Estimate:
    """The estimate of ``layout`` under the passes of the strategies active in it."""
    return evaluate(plan, layout, registry.passes(plan, layout), profile=cache.profile, cache=cache)


def states_lower_bound(plan: Plan, cache: ContextCache, tp: int, pp: int, dp: int, zero: int) -> float:
    """Model states of the fullest pipeline rank (v = 1), plus the runtime's fixed memory."""
    per_param = cache.profile.state_bytes or runtime_state_bytes(plan.train.precision, plan.train.optimizer, zero)
    worst = max(model_state_bytes(st.params, dp, zero, per_param).total for st in cache.stages(tp, pp, 1))
    return worst + (0.0 if plan.hardware.is_cpu else DEVICE_RUNTIME_OVERHEAD)


def refusal_of(plan: Plan, registry: Registry):
    """``layout -> None | reason``: what the strategies named in ``use`` blocks say of a layout
    (None without use blocks: the built-ins' rules are already the search space's)."""
    if not plan.uses:
        return None
    return lambda layout: registry.refusal(plan, layout)


def _refused(result: SearchResult, refuse, layout: Layout) -> bool:
    if refuse is None:
        return False
    reason = refuse(layout)
    if reason is not None:
        result.refused.setdefault(
            rung_for(
                layout.tp,
                layout.pp,
                layout.dp,
                layout.zero,
                layout.recompute,
                layout.schedule,
                layout.sequence_parallel,
            ),
            reason,
        )
    return reason is not None


def search(
    plan: Plan, registry: Registry, profile: RuntimeProfile = PLANC_RUNTIME, cache: ContextCache | None = None
) -> SearchResult:
    """Score the legal layouts of ``plan`` (respecting every fixed key and every ``use`` block)."""
    start = time.perf_counter()
    cache = cache or ContextCache(plan, profile)
    result = SearchResult()
    refuse = refusal_of(plan, registry)
    capacity = plan.hardware.memory
    gb = plan.train.global_batch
    recomputes = space.recompute_options(plan)
    for tp, pp, dp in space.degree_options(plan):
        schedules = space.schedule_options(plan, pp)
        sps = space.sp_options(plan, tp)
        mbs = space.micro_batch_options(plan, dp)
        if not schedules or not mbs:
            continue
        for zero in space.zero_options(plan, dp):
            bound = states_lower_bound(plan, cache, tp, pp, dp, zero)
            if bound > capacity:
                _record_bound(result, bound, tp, pp, dp, zero, recomputes, schedules, sps, mbs[0])
                continue
            if not _family_can_fit(
                plan, registry, cache, result, tp, pp, dp, zero, recomputes, schedules, sps, mbs, refuse
            ):
                continue
            for sp in sps:
                for schedule, v in schedules:
                    if not space.schedule_composes(schedule, dp, zero):
                        continue
                    fits_up_to = 0  # largest micro-batch that fit with less recomputation
                    for recompute in recomputes:
                        fit_here, best_speed = 0, 0.0
                        for mb in mbs:
                            if mb <= fits_up_to:
                                result.dominated.add(rung_for(tp, pp, dp, zero, recompute, schedule, sp))
                                continue
                            if not space.micro_batch_accepted(schedule, pp, gb // (dp * mb)):
                                continue
                            layout = make_layout(tp, pp, dp, zero, recompute, schedule, mb, v, sp)
                            if _refused(result, refuse, layout):
                                continue
                            estimate = evaluate_layout(plan, layout, registry, cache)
                            result.scored += 1
                            cand = Candidate(layout, estimate, complexity(layout))
                            if not estimate.fits:
                                _record_misfit(result, cand)
                                if zero >= 2 and mb != mbs[-1]:
                                    # FSDP keeps unsharded gradients while it accumulates: the one
                                    # micro-batch that needs no accumulation may still fit.
                                    _score_last(
                                        plan,
                                        registry,
                                        cache,
                                        result,
                                        tp,
                                        pp,
                                        dp,
                                        zero,
                                        recompute,
                                        schedule,
                                        mbs[-1],
                                        v,
                                        sp,
                                        refuse,
                                    )
                                break
                            result.fitting.append(cand)
                            fit_here = mb
                            speed = estimate.tokens_per_s
                            if speed < PAST_THE_BEST * best_speed:
                                break  # well past the best micro-batch of this configuration
                            best_speed = max(best_speed, speed)
                        fits_up_to = max(fits_up_to, fit_here)
    result.seconds = time.perf_counter() - start
    return result


def _score_last(plan, registry, cache, result, tp, pp, dp, zero, recompute, schedule, mb, v, sp, refuse) -> None:
    if not space.micro_batch_accepted(schedule, pp, plan.train.global_batch // (dp * mb)):
        return
    layout = make_layout(tp, pp, dp, zero, recompute, schedule, mb, v, sp)
    if _refused(result, refuse, layout):
        return
    estimate = evaluate_layout(plan, layout, registry, cache)
    result.scored += 1
    cand = Candidate(layout, estimate, complexity(layout))
    if estimate.fits:
        result.fitting.append(cand)
    else:
        _record_misfit(result, cand)


def _family_can_fit(plan, registry, cache, result, tp, pp, dp, zero, recomputes, schedules, sps, mbs, refuse) -> bool:
    """Score the family's least memory-hungry member first; if it does not fit, none does.

    Memory falls with more recomputation (full <= selective <= none), with sequence
    parallelism, with a smaller micro-batch, and is least for 1F1B / zero-bubble with v = 1
    among the schedules (interleaving holds (p - 1)/v more chunks, and v x the receive buffers).
    """
    schedule, v = min(schedules, key=lambda sv: (sv[0] not in (None, "1f1b", "zero-bubble"), sv[1]))
    gb = plan.train.global_batch
    # The smallest micro-batch holds the fewest activations; under FSDP (ZeRO-2/3) a single
    # micro-batch per step also drops the unsharded gradients kept for accumulation.
    tries = [mbs[0]] + ([mbs[-1]] if zero >= 2 and len(mbs) > 1 else [])
    witness = None
    for mb in tries:
        if not space.micro_batch_accepted(schedule, pp, gb // (dp * mb)):
            return True  # no cheap witness; let the full loop decide
        layout = make_layout(tp, pp, dp, zero, recomputes[-1], schedule, mb, v, sps[-1])
        if _refused(result, refuse, layout):
            return True  # the witness is not a legal layout; let the full loop decide
        estimate = evaluate_layout(plan, layout, registry, cache)
        result.scored += 1
        if estimate.fits:
            return True
        if witness is None or estimate.memory_bytes < witness.estimate.memory_bytes:
            witness = Candidate(layout, estimate, complexity(layout))
    estimate = witness.estimate
    _record_misfit(result, witness)
    for rung in _family_rungs(tp, pp, dp, zero, recomputes, schedules, sps):
        best = result.family_bound.get(rung)
        if best is None or estimate.memory_bytes < best.estimate.memory_bytes:
            result.family_bound[rung] = witness
    return False


def _family_rungs(tp, pp, dp, zero, recomputes, schedules, sps) -> set[int]:
    return {rung_for(tp, pp, dp, zero, r, s, sp) for r in recomputes for s, _ in schedules for sp in sps}


def _record_misfit(result: SearchResult, cand: Candidate) -> None:
    best = result.tightest_misfit.get(cand.rung)
    if best is None or cand.estimate.memory_bytes < best.estimate.memory_bytes:
        result.tightest_misfit[cand.rung] = cand


def _record_bound(result, bound, tp, pp, dp, zero, recomputes, schedules, sps, mb) -> None:
    # Keep the least memory-hungry member as the family's representative.
    schedule, v = min(schedules, key=lambda sv: (sv[0] not in (None, "1f1b", "zero-bubble"), sv[1]))
    layout = make_layout(tp, pp, dp, zero, recomputes[-1], schedule, mb, v, sps[-1])
    for rung in _family_rungs(tp, pp, dp, zero, recomputes, schedules, sps):
        best = result.states_bound.get(rung)
        if best is None or bound < best[0]:
            result.states_bound[rung] = (bound, layout)
