"""Score every legal layout of a plan, pruning what cannot fit or cannot win.

The legal values of each key come from :mod:`planc.legality.space`; the layouts are scored by
the cost model with the passes of the strategies active in each (``registry.passes``).
Pruning, each rule sound under the cost model:

1. **Model states first.** For each (tp, pp, dp, zero) -- a :class:`Family` -- the model states
   of the fullest pipeline rank are a lower bound on its memory; if they alone exceed the
   device, no recomputation, schedule or micro-batch can help, and none is scored (the bound is
   kept per rung for ``explain``).
2. **The least memory-hungry member first.** For each family one layout -- full recomputation,
   sequence parallel, the smallest micro-batch, 1F1B -- is scored first (under FSDP also the
   largest micro-batch, which needs no gradient accumulation); if none fits, no member of the
   family does.
3. **Micro-batches ascending, stop at the first misfit.** Activations grow with the
   micro-batch, so a larger one cannot fit where a smaller one did not (except, under FSDP,
   the single micro-batch per step, which is tried on its own: from the most recomputation
   down, while it can still fit or be its rung's closest miss). The loop also stops
   once throughput falls 10% below the best seen for the configuration (the micro-batch has
   passed its best: GEMM efficiency saturates while the bubble and the memory keep growing) --
   a heuristic, stated.
4. **Recompute only where needed.** At a micro-batch where less recomputation already fits,
   more recomputation costs time and buys nothing: it is not scored (the rung is marked
   "dominated").
5. **GPipe** only when asked for (see :mod:`planc.legality.space`).
6. **The most recomputation first where the family is tight.** Where a recomputation's loop
   starts, the layout with the most recomputation at that micro-batch (the floor) is scored
   first; if it misses, the loop's layouts cannot fit, and the first is skipped when it cannot
   be its rung's closest miss either. Only in families whose least hungry member fills
   :data:`FLOORS_FROM` of the device or more (elsewhere the floors mostly fit and are wasted).

Every scored layout is a :class:`Candidate`. One :class:`~planc.cost.ContextCache` serves the
whole search, so group links, stage splits and block times are computed once each.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from planc import stages
from planc.cost.context import ContextCache
from planc.cost.driver import evaluate
from planc.cost.estimate import Estimate
from planc.cost.memory import DEVICE_RUNTIME_OVERHEAD, ddp_replicates, model_state_bytes, runtime_state_bytes
from planc.cost.profile import PLANC_RUNTIME, RuntimeProfile
from planc.legality import space
from planc.legality.rules import RECOMPUTE_ORDER
from planc.planner.ladder import LayoutKeys, Rung, complexity, rung_of
from planc.spec.layout import Layout, Recompute, Schedule, ZeroStage
from planc.spec.plan import Plan

if TYPE_CHECKING:
    from planc.strategies.registry import Registry

#: The micro-batch loop stops once throughput falls below this fraction of the best seen for the
#: configuration. Not at the first dip: wave quantization makes throughput ripple with the
#: micro-batch (a heuristic, stated; see the module docstring).
PAST_THE_BEST = 0.9

#: Rule 6 runs in families whose least hungry member fills at least this fraction of the device.
#: It changes which layouts are scored, never the result: below it the floors mostly fit and are
#: thrown away (judgment scenarios: under 60%, 4 to 80 dominated floors per floor that missed;
#: from 60% on, 200 to 300 misses per 50 wasted).
FLOORS_FROM = 0.6

#: (schedule, virtual stages)
ScheduleChoice = tuple["Schedule | None", int]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One scored layout."""

    layout: Layout
    estimate: Estimate
    complexity: tuple[int, ...]

    @property
    def rung(self) -> Rung:
        return Rung(self.complexity[0])

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
    tightest_misfit: dict[Rung, Candidate] = field(default_factory=dict)
    """Per rung, the scored layout that missed by the least memory."""
    family_bound: dict[Rung, Candidate] = field(default_factory=dict)
    """Per rung, the least memory of a family ruled out by its least hungry member (a lower
    bound for every layout of the family on that rung)."""
    states_bound: dict[Rung, tuple[float, Layout, float]] = field(default_factory=dict)
    """Per rung, the smallest model-states lower bound of a pruned family (the runtime's fixed
    memory included), that family, and its model states alone."""
    pruned: list[Family] = field(default_factory=list)
    """The families whose model states alone exceed the device (none of their layouts is scored)."""
    refused: dict[Rung, str] = field(default_factory=dict)
    """Per rung, why a strategy named in a ``use`` block refused its layouts (they are not scored)."""
    dominated: set[Rung] = field(default_factory=set)
    """Rungs whose layouts were skipped because a simpler one fits at the same micro-batch."""
    scored: int = 0
    seconds: float = 0.0

    def note_misfit(self, cand: Candidate) -> None:
        best = self.tightest_misfit.get(cand.rung)
        if best is None or cand.estimate.memory_bytes < best.estimate.memory_bytes:
            self.tightest_misfit[cand.rung] = cand


@dataclass(frozen=True)
class Family:
    """One (tp, pp, dp, zero, shard_group) and the values the search tries for the other keys."""

    tp: int
    pp: int
    dp: int
    zero: ZeroStage
    recomputes: tuple[Recompute, ...]
    schedules: tuple[ScheduleChoice, ...]
    sps: tuple[bool, ...]
    micro_batches: tuple[int, ...]
    shard_group: int | None = None
    """HSDP's shard group (None: plain ZeRO over all of dp)."""

    def layout(self, recompute: Recompute, schedule: ScheduleChoice, sp: bool, micro_batch: int) -> Layout:
        """A member, without re-validation (the search only builds consistent layouts)."""
        return Layout.model_construct(
            tp=self.tp,
            pp=self.pp,
            dp=self.dp,
            zero=self.zero,
            recompute=recompute,
            schedule=schedule[0],
            micro_batch=micro_batch,
            virtual_stages=schedule[1],
            sequence_parallel=sp,
            shard_group=self.shard_group,
        )

    def leanest(self, micro_batch: int) -> Layout:
        """The member that needs the least memory at ``micro_batch``: full recomputation (the last
        option), sequence parallel, and 1F1B / zero-bubble with the fewest virtual stages
        (interleaving holds (p - 1)/v more stages, and v x the receive buffers)."""
        schedule = min(self.schedules, key=lambda sv: (sv[0] not in (None, "1f1b", "zero-bubble"), sv[1]))
        return self.layout(self.recomputes[-1], schedule, self.sps[-1], micro_batch)

    def leanest_on(self, rung: Rung, micro_batch: int) -> Layout | None:
        """The member of ``rung`` that needs the least memory at ``micro_batch`` (None: the family
        has no member there): the most recomputation, sequence parallel and the leanest schedule
        the rung allows, so a row of ``explain`` shows a layout of its own rung."""
        on_rung = [m for m in self._members() if rung_of(m) == rung]
        if not on_rung:
            return None
        m = min(on_rung, key=hunger)
        return self.layout(m.recompute, (m.schedule, m.virtual_stages), m.sequence_parallel, micro_batch)

    def rungs(self) -> set[Rung]:
        return {rung_of(m) for m in self._members()}

    def _members(self) -> list[_MemberKeys]:
        """Every member's keys but the micro-batch, cheap to build (a rung and a memory order
        need no :class:`Layout`)."""
        return [
            _MemberKeys(self.tp, self.pp, self.dp, self.zero, r, s[0], sp, s[1], self.shard_group)
            for r in self.recomputes
            for s in self.schedules
            for sp in self.sps
        ]


class _MemberKeys(NamedTuple):
    """The keys the ladder and :func:`hunger` read (:class:`~planc.planner.ladder.LayoutKeys`)."""

    tp: int
    pp: int
    dp: int
    zero: int
    recompute: Recompute
    schedule: Schedule | None
    sequence_parallel: bool
    virtual_stages: int
    shard_group: int | None


def hunger(layout: LayoutKeys) -> tuple[int, bool, bool, int]:
    """Orders a family's members from the least memory-hungry (see :meth:`Family.leanest`)."""
    lean_schedule = layout.schedule in (None, "1f1b", "zero-bubble")
    return (
        -RECOMPUTE_ORDER.index(layout.recompute),
        not layout.sequence_parallel,
        not lean_schedule,
        layout.virtual_stages,
    )


def families(plan: Plan) -> Iterator[Family]:
    """Every (tp, pp, dp, zero, shard_group) of the plan's legal space that has schedules and
    micro-batches."""
    recomputes = tuple(space.recompute_options(plan))
    for tp, pp, dp in space.degree_options(plan):
        schedules = tuple(space.schedule_options(plan, pp))
        sps = tuple(space.sp_options(plan, tp))
        mbs = tuple(space.micro_batch_options(plan, dp))
        if not schedules or not mbs or not sps:
            continue
        for zero in space.zero_options(plan, dp):
            for group in space.shard_group_options(plan, tp, pp, dp, zero):
                yield Family(tp, pp, dp, zero, recomputes, schedules, sps, mbs, group)


class Scorer:
    """Scores layouts of one plan and keeps the search's bookkeeping."""

    def __init__(self, plan: Plan, registry: Registry, cache: ContextCache, result: SearchResult) -> None:
        self.plan, self.registry, self.cache, self.result = plan, registry, cache, result
        self.refuse: Callable[[Layout], str | None] | None = (
            (lambda layout: registry.refusal(plan, layout)) if plan.uses else None
        )

    def runs(self, layout: Layout) -> bool:
        """Whether the schedule takes the layout's micro-batch count and no ``use`` block refuses it
        (a refusal is recorded for explain)."""
        if not self._schedule_takes(layout):
            return False
        reason = self.refuse(layout) if self.refuse is not None else None
        if reason is not None:
            self.result.refused.setdefault(rung_of(layout), reason)
        return reason is None

    def allows(self, layout: Layout) -> bool:
        """:meth:`runs` without recording a refusal (for a layout scored ahead of its turn)."""
        return self._schedule_takes(layout) and (self.refuse is None or self.refuse(layout) is None)

    def _schedule_takes(self, layout: Layout) -> bool:
        m = stages.micro_batches(self.plan.train.global_batch, layout.dp, layout.micro_batch)
        return space.micro_batch_accepted(layout.schedule, layout.pp, m)

    def score(self, layout: Layout) -> Candidate:
        estimate = evaluate_layout(self.plan, layout, self.registry, self.cache)
        self.result.scored += 1
        return Candidate(layout, estimate, complexity(layout))


def evaluate_layout(plan: Plan, layout: Layout, registry: Registry, cache: ContextCache) -> Estimate:
    """The estimate of ``layout`` under the passes of the strategies active in it."""
    return evaluate(plan, layout, registry.passes(plan, layout), profile=cache.profile, cache=cache)


def runtime_overhead(plan: Plan) -> float:
    """The runtime's fixed memory per device (CUDA context and library workspaces; none on CPU)."""
    return 0.0 if plan.hardware.is_cpu else DEVICE_RUNTIME_OVERHEAD


def model_states_bound(plan: Plan, cache: ContextCache, family: Family) -> float:
    """Model states of the family's fullest pipeline rank (v = 1)."""
    train = plan.train
    per_param = cache.profile.state_bytes or runtime_state_bytes(
        train.precision, train.optimizer, family.zero, family.dp, ddp_replicates(plan)
    )
    shards = family.shard_group or family.dp  # HSDP shards over its group only
    return max(
        model_state_bytes(st.params, shards, family.zero, per_param).total
        for st in cache.stages(family.tp, family.pp, 1)
    )


def search(
    plan: Plan, registry: Registry, profile: RuntimeProfile = PLANC_RUNTIME, cache: ContextCache | None = None
) -> SearchResult:
    """Score the legal layouts of ``plan`` (respecting every fixed key and every ``use`` block)."""
    start = time.perf_counter()
    cache = cache or ContextCache(plan, profile)
    result = SearchResult()
    scorer = Scorer(plan, registry, cache, result)
    for family in families(plan):
        states = model_states_bound(plan, cache, family)
        if states + runtime_overhead(plan) > plan.hardware.memory:
            _note_states_bound(result, family, states, runtime_overhead(plan))
            continue
        fullness = _family_fullness(scorer, family)
        if fullness is None:
            continue
        for sp in family.sps:
            for schedule in family.schedules:
                if space.schedule_composes(schedule[0], family.dp, family.zero):
                    _scan(scorer, family, schedule, sp, floors=fullness >= FLOORS_FROM)
    result.seconds = time.perf_counter() - start
    return result


def leanest_pruned(
    plan: Plan, registry: Registry, cache: ContextCache, result: SearchResult, below: float = float("inf")
) -> list[Candidate]:
    """The least memory-hungry member of each family pruned by its model states (rule 1), scored
    -- those whose bound is under ``below`` (no other can need less). Only when nothing fits: the
    family with the smallest model states need not be the one with the least memory (a deeper
    pipeline holds more receive buffers and a wider stage more autocast copies)."""
    scorer = Scorer(plan, registry, cache, SearchResult())
    found = []
    for family in result.pruned:
        if states_bound(plan, cache, family) >= below:
            continue
        mbs = family.micro_batches
        for mb in [mbs[0]] + ([mbs[-1]] if family.zero >= 2 and len(mbs) > 1 else []):
            layout = family.leanest(mb)
            if scorer.runs(layout):
                found.append(scorer.score(layout))
    return found


def states_bound(plan: Plan, cache: ContextCache, family: Family) -> float:
    """The model-states lower bound of a family's memory: its states and the runtime's fixed memory."""
    return model_states_bound(plan, cache, family) + runtime_overhead(plan)


def _scan(scorer: Scorer, family: Family, schedule: ScheduleChoice, sp: bool, floors: bool) -> None:
    """Recomputation from none to full, each over the micro-batches ascending (rules 3 and 4;
    with ``floors``, rule 6)."""
    recomputes = [r for r in family.recomputes if space.recompute_composes(schedule[0], r)]
    if not recomputes:
        return
    floor = _Floors(scorer, family, schedule, sp, recomputes[-1]) if floors else None
    fits_up_to = 0  # largest micro-batch that fit with less recomputation
    alone: list[Layout] = []  # FSDP's single micro-batch per step, to try on its own
    for recompute in recomputes:
        fit_here = 0
        best_speed = 0.0
        first = True
        for mb in family.micro_batches:
            layout = family.layout(recompute, schedule, sp, mb)
            if mb <= fits_up_to:
                scorer.result.dominated.add(rung_of(layout))
                continue
            if not scorer.runs(layout):
                continue
            cand = floor.score(layout, first) if floor else scorer.score(layout)
            first = False
            if cand is None or not cand.fits:
                if cand is not None:
                    scorer.result.note_misfit(cand)
                if family.zero >= 2 and mb != family.micro_batches[-1]:
                    # FSDP keeps unsharded gradients while it accumulates: the one micro-batch
                    # that needs no accumulation may still fit.
                    alone.append(family.layout(recompute, schedule, sp, family.micro_batches[-1]))
                break
            scorer.result.fitting.append(cand)
            fit_here = mb
            if cand.tokens_per_s < PAST_THE_BEST * best_speed:
                break  # well past the best micro-batch of this configuration
            best_speed = max(best_speed, cand.tokens_per_s)
        fits_up_to = max(fits_up_to, fit_here)
    _score_alone(scorer, alone)


class _Floors:
    """Rule 6: a scan's layouts with its most recomputation (the floor of memory at their
    micro-batch), scored once each, so that where less recomputation starts its micro-batches
    a floor that misses spares scoring layouts that cannot fit.

    Memory does not fall with less recomputation or a larger micro-batch (rules 2 and 3), so
    when the floor misses at the micro-batch where a recomputation's loop starts, that loop
    has no fitting layout; its first layout is not scored when it also cannot be its rung's
    closest miss (:func:`_cannot_matter`). Only the loop's first micro-batch asks: past it the
    floor mostly fits and its score would be thrown away (a fitting floor below a fitting
    layout with less recomputation is dominated, rule 4). GPT 1T on 3072 GPUs scored 1,538
    misses in 2,192 layouts before this rule, 1,413 layouts with it (668 misses).
    """

    def __init__(self, scorer: Scorer, family: Family, schedule: ScheduleChoice, sp: bool, most: Recompute):
        self.scorer, self.family, self.schedule, self.sp, self.most = scorer, family, schedule, sp, most
        self.scored: dict[int, Candidate | None] = {}

    def score(self, layout: Layout, first: bool) -> Candidate | None:
        """``layout``'s score, or None where it can neither fit nor be its rung's closest miss."""
        if layout.recompute == self.most:
            return self._floor(layout.micro_batch) or self.scorer.score(layout)
        if first:
            floor = self._floor(layout.micro_batch)
            if floor is not None and _cannot_matter(self.scorer.result, floor, layout):
                return None
        return self.scorer.score(layout)

    def _floor(self, micro_batch: int) -> Candidate | None:
        """The floor at ``micro_batch`` (None when a ``use`` block refuses it), scored once; a miss
        is recorded at once (the loop with the most recomputation starts at or below it)."""
        if micro_batch not in self.scored:
            layout = self.family.layout(self.most, self.schedule, self.sp, micro_batch)
            floor = self.scorer.score(layout) if self.scorer.allows(layout) else None
            if floor is not None and not floor.fits:
                self.scorer.result.note_misfit(floor)
            self.scored[micro_batch] = floor
        return self.scored[micro_batch]


def _score_alone(scorer: Scorer, layouts: list[Layout]) -> None:
    """Score a scan's single-micro-batch members (one per recomputation, in the scan's order: less
    recomputation first), from the most recomputation down, while a score can still change
    anything.

    More recomputation never needs more memory (rule 2's order). Once a member misses, and its
    rung already has a recorded miss that needs no more, a member with less recomputation can
    neither fit nor be that rung's closest miss: it and the rest are not scored. Before this rule,
    GPT 1T on 3072 GPUs scored 1,435 such members of its 2,713 layouts; 40 of them fitted.
    """
    floor: Candidate | None = None
    for layout in reversed(layouts):
        # ``runs`` first: it records what a use block refuses, scored or not.
        if not scorer.runs(layout) or (floor is not None and _cannot_matter(scorer.result, floor, layout)):
            continue
        floor = scorer.score(layout)
        if floor.fits:
            scorer.result.fitting.append(floor)
        else:
            scorer.result.note_misfit(floor)


def _cannot_matter(result: SearchResult, floor: Candidate, layout: Layout) -> bool:
    """Whether ``layout``, needing at least ``floor``'s memory, can neither fit nor be its rung's
    closest miss: the floor misses, and the layout's rung (the floor's, or another: without tensor
    or pipeline parallelism recomputation is the rung) already has a miss needing no more."""
    if floor.fits:
        return False
    closest = result.tightest_misfit.get(rung_of(layout))
    return closest is not None and closest.estimate.memory_bytes <= floor.estimate.memory_bytes


def _family_fullness(scorer: Scorer, family: Family) -> float | None:
    """Score the family's least memory-hungry member first; if it does not fit, none does (None).
    Otherwise how full that member at the smallest micro-batch leaves the device (its memory over
    the capacity; above 1 where only FSDP's single micro-batch fits; inf when unknown).

    Memory falls with more recomputation (full <= selective <= none), with sequence
    parallelism, with a smaller micro-batch, and is least for 1F1B / zero-bubble with v = 1.
    """
    mbs = family.micro_batches
    # The smallest micro-batch holds the fewest activations; under FSDP (ZeRO-2/3) a single
    # micro-batch per step also drops the unsharded gradients kept for accumulation.
    tries = [mbs[0]] + ([mbs[-1]] if family.zero >= 2 and len(mbs) > 1 else [])
    witness: Candidate | None = None
    fullness = float("inf")
    for mb in tries:
        layout = family.leanest(mb)
        if not scorer.runs(layout):
            return fullness  # no cheap witness; let the full loop decide
        cand = scorer.score(layout)
        if mb == mbs[0]:
            fullness = cand.estimate.memory_bytes / cand.estimate.capacity
        if cand.fits:
            return fullness
        if witness is None or cand.estimate.memory_bytes < witness.estimate.memory_bytes:
            witness = cand
    assert witness is not None  # tries is never empty
    scorer.result.note_misfit(witness)
    for rung in family.rungs():
        best = scorer.result.family_bound.get(rung)
        if best is not None and witness.estimate.memory_bytes >= best.estimate.memory_bytes:
            continue  # the rung's own member needs at least the witness's memory: no closer miss
        own = _own_member(scorer, family, rung, witness)
        if own is None:
            continue
        if own.fits:  # the cost model is not monotone here after all: let the full loop decide
            return fullness
        if best is None or own.estimate.memory_bytes < best.estimate.memory_bytes:
            scorer.result.family_bound[rung] = own
    return None


def _own_member(scorer: Scorer, family: Family, rung: Rung, witness: Candidate) -> Candidate | None:
    """The family's least-hungry member on ``rung`` at the witness's micro-batch, scored (the witness
    itself when it is on that rung), so a rung's bound is shown with a layout of that rung."""
    if witness.rung == rung:
        return witness
    layout = family.leanest_on(rung, witness.layout.micro_batch)
    if layout is None or not scorer.runs(layout):
        return None
    return scorer.score(layout)


def _note_states_bound(result: SearchResult, family: Family, states: float, overhead: float) -> None:
    """Keep the family's least memory-hungry member as its representative on each of its rungs."""
    result.pruned.append(family)
    bound = states + overhead
    for rung in family.rungs():
        best = result.states_bound.get(rung)
        layout = family.leanest_on(rung, family.micro_batches[0])
        if layout is not None and (best is None or bound < best[0]):
            result.states_bound[rung] = (bound, layout, states)
