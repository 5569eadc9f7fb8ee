"""The rule: the simplest layout that fits, within a tolerance of the fastest.

1. Score every legal layout (:mod:`planc.planner.explore`); a layout fits when its memory is
   within the device's memory less the plan's headroom (``hardware.headroom``).
2. Among those that fit, find the best throughput (tokens/s).
3. Keep those the best does not beat by more than the margin (:mod:`planc.planner.margin`: the
   model's measured uncertainty and a floor in seconds, or the plan's ``tolerance``).
   Layouts that shard data parallelism past every published run the model was checked on
   (:mod:`planc.planner.checked`) are set aside first when a checked layout fits.
4. Pick the one with the smallest complexity rank (:mod:`planc.planner.ladder`), the pipeline's
   depth (pp) left out; among those layouts within :data:`~planc.planner.margin.TIE_BAND` of
   each other, the one that leaves the most memory free, when it frees at least ``MEMORY_WORTH``
   of the capacity; otherwise the fastest.

For every rung below the chosen one, :class:`Rejection` records the number that ruled it out:
the memory its least-hungry layout needs, or how much slower its fastest fitting layout is and
which part of the step grew. A plan whose layout and micro-batch are all fixed is evaluated as
written, fitting or not. When nothing fits, the least-hungry layout is returned with
``fits=False`` and a suggestion of what would fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from planc.cost.context import ContextCache
from planc.cost.estimate import Estimate
from planc.cost.profile import PLANC_RUNTIME, RuntimeProfile
from planc.legality.rules import AUTO, MULTI_STAGE_SCHEDULES, fixed
from planc.legality.space import why_no_layout
from planc.planner.checked import unchecked
from planc.planner.explore import Candidate, SearchResult, evaluate_layout, hunger, leanest_pruned, search
from planc.planner.ladder import Rung, complexity, rung_of, tier
from planc.planner.margin import MEMORY_WORTH, TIE_BAND, Margin, planner_margin
from planc.planner.rejections import Rejection, why_not_simpler
from planc.planner.suggest import Suggestion, suggest_fix
from planc.spec.layout import Layout
from planc.spec.plan import Plan

if TYPE_CHECKING:
    from planc.strategies.registry import Registry


@dataclass(frozen=True)
class Choice:
    """The planner's answer for one plan."""

    layout: Layout
    estimate: Estimate
    fits: bool
    rejected: tuple[Rejection, ...]
    alternatives: tuple[Candidate, ...]
    tolerance: float
    """The relative band the choice was made with (``margin.relative``)."""
    rung: Rung
    """The chosen layout's rung on the ladder."""
    fixed: bool = False
    """The plan fixed every layout key: evaluated as given."""
    suggestion: Suggestion | None = None
    """When nothing fits: what would."""
    best: Candidate | None = None
    """The fastest fitting layout (may equal the chosen one)."""
    scored: int = 1
    search_seconds: float = 0.0
    margin: Margin | None = None
    """What a more complex layout had to buy (None only for Choices built by hand)."""
    advice: tuple = ()
    """Warnings and hints about the plan (:func:`planc.planner.advice.advise`; set by explain)."""
    set_aside: Candidate | None = None
    """The layout the rule would have picked, set aside because it shards data parallelism past
    every published check (:func:`prefer_checked`)."""


def is_fully_fixed(plan: Plan) -> bool:
    """True when the plan leaves nothing for the planner to choose."""
    return fixed_layout(plan) is not None


def fixed_layout(plan: Plan) -> Layout | None:
    """The layout a plan fixes completely (micro-batch included), or None when it leaves a key
    to the planner."""
    lay, mb = plan.layout, plan.train.micro_batch
    tp, pp, dp, zero, recompute = lay.tp, lay.pp, lay.dp, lay.zero, lay.recompute
    if not (fixed(tp) and fixed(pp) and fixed(dp) and fixed(zero) and fixed(mb)) or recompute == AUTO:
        return None
    schedule, v = None, 1
    if pp > 1:
        if lay.schedule == AUTO:
            return None
        schedule = lay.schedule
        if schedule in MULTI_STAGE_SCHEDULES:
            if not fixed(lay.virtual_stages):
                return None
            v = lay.virtual_stages
    if tp > 1 and not fixed(lay.sequence_parallel):
        return None
    if lay.shard_group == AUTO:  # plain FSDP or HSDP: the planner decides
        return None
    sp = lay.sequence_parallel is True and tp > 1
    return Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        zero=zero,
        recompute=recompute,
        schedule=schedule,
        micro_batch=mb,
        virtual_stages=v,
        sequence_parallel=sp,
        shard_group=lay.shard_group,
    )


def choose(
    plan: Plan,
    registry: Registry,
    *,
    tolerance: float | None = None,
    top_k: int = 5,
    profile: RuntimeProfile = PLANC_RUNTIME,
) -> Choice:
    """Pick the layout for ``plan``: the simplest that fits, within ``tolerance`` of the best, under
    the strategies of ``registry``."""
    margin = planner_margin(plan.layout.tolerance if tolerance is None else tolerance, plan.hardware)
    tol = margin.relative
    cache = ContextCache(plan, profile)
    layout = fixed_layout(plan)
    if layout is not None:
        est = evaluate_layout(plan, layout, registry, cache)
        suggestion = None if est.fits else suggest_fix(plan, est, registry, profile)
        return Choice(
            layout, est, est.fits, (), (), tol, rung_of(layout), fixed=True, suggestion=suggestion, margin=margin
        )

    result = search(plan, registry, profile, cache)
    if not result.fitting:
        return replace(_nothing_fits(plan, registry, result, tol, profile, cache), margin=margin)

    candidates, set_aside = prefer_checked(plan, result.fitting)
    best = max(candidates, key=lambda c: c.tokens_per_s)
    chosen = pick(candidates, best, margin)
    # What the rule would have picked with every fitting layout in play, if that was set aside.
    every = result.fitting
    unchecked_pick = pick(every, max(every, key=lambda c: c.tokens_per_s), margin) if set_aside else None
    others = sorted((c for c in result.fitting if c is not chosen), key=lambda c: -c.tokens_per_s)
    return Choice(
        layout=chosen.layout,
        estimate=chosen.estimate,
        fits=True,
        rejected=tuple(why_not_simpler(plan, result, chosen, best, tol)),
        alternatives=tuple(others[:top_k]),
        tolerance=tol,
        rung=chosen.rung,
        best=best,
        scored=result.scored,
        search_seconds=result.seconds,
        margin=margin,
        set_aside=unchecked_pick if unchecked_pick is not None and unchecked_pick is not chosen else None,
    )


def prefer_checked(plan: Plan, fitting: list[Candidate]) -> tuple[list[Candidate], list[Candidate]]:
    """(the candidates to choose from, those set aside): layouts past every published check of
    sharded data parallelism (:mod:`planc.planner.checked`) are set aside when a checked one fits
    -- a prediction the model has never been held to does not outbid one it has."""
    past = [unchecked(plan, c.layout, c.estimate) for c in fitting]
    if not any(past) or all(past):
        return fitting, []
    return [c for c, p in zip(fitting, past) if not p], [c for c, p in zip(fitting, past) if p]


def pick(fitting: list[Candidate], best: Candidate, margin: Margin) -> Candidate:
    """The rule: the simplest layout the best does not beat by more than ``margin``; among the
    equally simple, speed within :data:`TIE_BAND` is a tie and goes to the least memory when that
    frees at least :data:`MEMORY_WORTH` of the capacity."""
    eligible = [c for c in fitting if margin.within(c.estimate.step_s, best.estimate.step_s)]
    simplest = min(c.complexity for c in eligible)
    # The pipeline's depth does not make a program more complex to run (virtual stages do: more
    # chunks, more transfers): layouts that differ only in pp are one tier, decided by speed and
    # memory.
    same_tier = [c for c in eligible if tier(c.complexity) == tier(simplest)]
    quickest = max(same_tier, key=lambda c: c.tokens_per_s)
    tied = [c for c in same_tier if c.tokens_per_s >= quickest.tokens_per_s * (1.0 - TIE_BAND)]
    roomiest = min(tied, key=lambda c: (c.estimate.memory_bytes, -c.tokens_per_s))
    saved = quickest.estimate.memory_bytes - roomiest.estimate.memory_bytes
    return roomiest if saved >= MEMORY_WORTH * quickest.estimate.capacity else quickest


# -- nothing fits ------------------------------------------------------------------------------


def _nothing_fits(
    plan: Plan, registry: Registry, result: SearchResult, tol: float, profile: RuntimeProfile, cache: ContextCache
) -> Choice:
    """The layout that needs the least memory of all the search tried: the scored misfits and the
    leanest member of every family its model states ruled out (scored now: the smallest model
    states need not come with the least memory), so "shown: the least memory-hungry" is true."""
    misfits = list(result.tightest_misfit.values()) + list(result.family_bound.values())
    below = min((c.estimate.memory_bytes for c in misfits), default=float("inf"))
    misfits += leanest_pruned(plan, registry, cache, result, below)
    if not misfits:
        raise NoLegalLayout(plan, next(iter(result.refused.values()), None))
    # Equal needs: the least memory-hungry member's settings first, then the simplest.
    least = min(misfits, key=lambda c: (c.estimate.memory_bytes, hunger(c.layout), c.complexity))
    layout, est = least.layout, least.estimate
    chosen = Candidate(layout, est, complexity(layout))
    return Choice(
        layout=layout,
        estimate=est,
        fits=False,
        rejected=tuple(why_not_simpler(plan, result, chosen, None, tol)),
        alternatives=(),
        tolerance=tol,
        rung=rung_of(layout),
        suggestion=suggest_fix(plan, est, registry, profile),
        scored=result.scored,
        search_seconds=result.seconds,
    )


class NoLegalLayout(Exception):
    """The plan's fixed keys and divisibility leave no layout at all (``planc check`` reports the
    same through :func:`~planc.legality.space.why_no_layout`; this catches plans built otherwise)."""

    def __init__(self, plan: Plan, refusal: str | None = None) -> None:
        issue = why_no_layout(plan)
        self.hint: str | None
        if issue is None and refusal is not None:
            super().__init__(f"no legal layout: every layout was refused, e.g. by {refusal}")
            self.hint = "change the use block's options or the fixed layout keys, or remove the use block"
            return
        what = issue.message if issue else f"no legal layout for {plan.world_size} devices"
        super().__init__(f"{what} ({'.'.join(map(str, issue.path))})" if issue and issue.path else what)
        self.hint = issue.hint if issue else "set some layout keys to auto, or change the device count"
