"""Why each simpler rung was not chosen, as data: the rung, the limit it hit, and the numbers.

The planner never words a rejection; :mod:`planc.explain.words` does, with the same unit
formatters as the rest of ``planc explain``. A :class:`Rejection` says which :class:`Limit` ruled
the rung out and carries the numbers that show it (memory against capacity, step time against
the chosen one's, the step part that grew, the plan keys that exclude it, the degrees that do
not divide the batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from planc.cost.estimate import Estimate
from planc.legality import space
from planc.legality.rules import AUTO
from planc.planner.explore import Candidate, SearchResult
from planc.planner.ladder import Rung, schedule_rung, tier
from planc.spec.layout import Layout
from planc.spec.plan import Plan


class Limit(Enum):
    """What ruled a rung out."""

    MEMORY = "memory"
    """Its layout that missed by the least memory does not fit."""
    FAMILY_MEMORY = "family_memory"
    """Even the least memory-hungry member of its best family does not fit (a lower bound)."""
    MODEL_STATES = "model_states"
    """The model states alone exceed the device (no layout of the rung was scored): ``memory_bytes``
    is the lower bound (the runtime's fixed memory included), ``memory_part`` the model states."""
    SLOWER = "slower"
    """It fits, but its fastest layout is slower than the chosen one."""
    WITHIN_TOLERANCE = "within_tolerance"
    """It fits and is faster, but the chosen layout is simpler and within the tolerance."""
    REFUSED = "refused"
    """A strategy named in a ``use`` block refused its layouts."""
    DOMINATED = "dominated"
    """Less recomputation fits the same micro-batch and is faster."""
    EXCLUDED = "excluded"
    """A key the plan fixes excludes it."""
    GPIPE_NOT_TRIED = "gpipe_not_tried"
    """GPipe is tried only when the plan asks for it."""
    NO_TENSOR_SPLIT = "no_tensor_split"
    """No tp > 1 fits inside a node and divides the model's widths."""
    NO_DEVICE_SPLIT = "no_device_split"
    """No split of the devices without pipeline stages."""
    BATCH_SPLIT = "batch_split"
    """Every data-parallel degree the rung allows fails to divide (or exceeds) the global batch."""
    NO_LEGAL_LAYOUT = "no_legal_layout"
    """Some other rule leaves the rung no legal layout."""


@dataclass(frozen=True)
class Rejection:
    """Why a simpler rung was not chosen: the limit and the numbers that show it."""

    rung: Rung
    limit: Limit
    fits: bool | None
    """Whether its best layout fits (None: nothing was scored on this rung)."""
    layout: Layout | None = None
    """Its best try (the family, for MODEL_STATES)."""
    memory_bytes: float | None = None
    capacity_bytes: float | None = None
    step_s: float | None = None
    slowdown: float | None = None
    """Its step time over the chosen one's."""
    chosen_step_s: float | None = None
    grown: tuple[str, float] | None = None
    """The part of its step that grew most against the chosen one's, and that part's seconds."""
    memory_part: tuple[str, float] | None = None
    """The largest part of its memory (model states, activations or buffers), for the misfits."""
    memory_detail: tuple[str, float] | None = None
    """The largest named share of the activations, when they are the largest part and it is most of them."""
    behind_best: float | None = None
    """How far it trails the fastest layout, when that is not the chosen one (a fraction)."""
    tolerance: float | None = None
    alike: bool = False
    """SLOWER: it ranks as simple as the chosen layout (a TP rung below TP + SP: only sequence
    parallelism differs, :func:`~planc.planner.ladder.tier`): speed and memory decided, not the margin."""
    chosen_memory_bytes: float | None = None
    keys: tuple[str, ...] = ()
    """EXCLUDED: the plan's keys that exclude the rung, as written (``schedule = gpipe``)."""
    refusal: str | None = None
    """REFUSED: the strategy's own message."""
    devices: int | None = None
    per_node: int | None = None
    global_batch: int | None = None
    degrees: tuple[int, ...] = ()
    """BATCH_SPLIT: the data-parallel degrees the rung allows."""

    @property
    def strategy(self) -> str:
        """The rung's name on the ladder ("DDP", "+ TP")."""
        return self.rung.label


def why_not_simpler(
    plan: Plan, result: SearchResult, chosen: Candidate, best: Candidate | None, tolerance: float
) -> list[Rejection]:
    """One :class:`Rejection` per rung below the chosen one (the single device only on one device),
    and under a chosen HSDP layout one more for its own rung without HSDP (plain ZeRO)."""
    fastest: dict[Rung, Candidate] = {}
    for c in result.fitting:
        if c.rung not in fastest or c.tokens_per_s > fastest[c.rung].tokens_per_s:
            fastest[c.rung] = c
    rows = []
    for rung in map(Rung, range(chosen.rung)):
        if rung == Rung.SINGLE_DEVICE and chosen.estimate.world_size > 1:
            continue  # one device of many is not a layout
        if rung in fastest:
            rows.append(_slower(rung, fastest[rung], chosen, best, tolerance))
            continue
        rows.append(_closest_miss(result, rung, chosen.estimate.capacity) or _not_scored(plan, result, rung))
    if chosen.layout.shard_group is not None:
        rows += _without_hsdp(result, chosen, best, tolerance)
    return rows


def _without_hsdp(result: SearchResult, chosen: Candidate, best: Candidate | None, tolerance: float) -> list[Rejection]:
    """The chosen HSDP layout's rung and degrees sharded over all of dp: its fastest fitting layout
    (slower by more than the margin, or the rule would have taken it: it ranks simpler), else
    its closest miss; nothing when it was not scored (a plan that fixes shard_group)."""
    lay = chosen.layout

    def plain(c: Candidate) -> bool:
        same = (c.layout.tp, c.layout.pp, c.layout.dp, c.layout.zero) == (lay.tp, lay.pp, lay.dp, lay.zero)
        return same and c.layout.shard_group is None and c.rung == chosen.rung

    fitting = [c for c in result.fitting if plain(c)]
    if fitting:
        return [_slower(chosen.rung, max(fitting, key=lambda c: c.tokens_per_s), chosen, best, tolerance)]
    misfit = result.tightest_misfit.get(chosen.rung)
    if misfit is not None and plain(misfit):
        return [_misfit(chosen.rung, Limit.MEMORY, misfit, chosen.estimate.capacity)]
    return []


def _not_scored(plan: Plan, result: SearchResult, rung: Rung) -> Rejection:
    if rung in result.refused:
        return Rejection(rung, Limit.REFUSED, None, refusal=result.refused[rung])
    if rung in result.dominated:
        return Rejection(rung, Limit.DOMINATED, None)
    return why_no_layout_on(plan, rung)


def _closest_miss(result: SearchResult, rung: Rung, capacity: float) -> Rejection | None:
    """The rung's nearest miss among the scored misfits and the bounds, or None."""
    options = []
    c = result.tightest_misfit.get(rung)
    if c is not None and c.rung == rung:
        options.append(_misfit(rung, Limit.MEMORY, c, capacity))
    if rung in result.family_bound:
        options.append(_misfit(rung, Limit.FAMILY_MEMORY, result.family_bound[rung], capacity))
    if options:
        # A scored layout's need is what it needs; a model-states bound is only a lower bound of a
        # family that would need more (its activations and buffers come on top). Comparing the two
        # would name the bound as the blocker when the activations are (an 8B model at 128 k).
        return min(options, key=lambda r: r.memory_bytes or 0.0)
    if rung in result.states_bound:
        bound, layout, states = result.states_bound[rung]
        return Rejection(rung, Limit.MODEL_STATES, False, layout, bound, capacity, memory_part=("model states", states))
    return None


def _misfit(rung: Rung, limit: Limit, c: Candidate, capacity: float) -> Rejection:
    est = c.estimate
    part = largest_memory_part(est)
    detail = largest_activation_term(est) if part[0] == "activations" else None
    return Rejection(
        rung, limit, False, c.layout, est.memory_bytes, capacity, est.step_s, memory_part=part, memory_detail=detail
    )


def _slower(rung: Rung, c: Candidate, chosen: Candidate, best: Candidate | None, tolerance: float) -> Rejection:
    est, ref = c.estimate, chosen.estimate
    ratio = est.step_s / ref.step_s
    alike = tier(c.complexity) == tier(chosen.complexity)
    behind = None
    if best is not None and best is not chosen and 1.0 <= ratio < 1.0 / (1.0 - tolerance):
        behind = 1.0 - c.tokens_per_s / best.tokens_per_s
    return Rejection(
        rung,
        Limit.SLOWER if ratio >= 1.0 else Limit.WITHIN_TOLERANCE,
        True,
        c.layout,
        est.memory_bytes,
        est.capacity,
        est.step_s,
        ratio,
        chosen_step_s=ref.step_s,
        grown=grown_part(est, ref) if ratio >= 1.0 else None,
        behind_best=None if alike else behind,
        tolerance=tolerance,
        alike=alike,
        chosen_memory_bytes=ref.memory_bytes,
    )


def grown_part(est: Estimate, ref: Estimate) -> tuple[str, float] | None:
    """The part of ``est``'s step that grew most against ``ref``'s, with its seconds (None: none grew)."""
    a, b = est.step_parts(), ref.step_parts()
    deltas = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in set(a) | set(b)}
    key, delta = max(deltas.items(), key=lambda kv: kv[1])
    return (key, a.get(key, 0.0)) if delta > 0 else None


def largest_memory_part(est: Estimate) -> tuple[str, float]:
    s = est.memory
    parts = {"model states": s.model_states_at_peak, "activations": s.activations, "buffers": s.transient_bytes}
    key = max(parts, key=lambda k: parts[k])
    return key, parts[key]


def largest_activation_term(est: Estimate) -> tuple[str, float] | None:
    """The largest named share of the activations when it is most of them (logits and loss at long
    context, say), so a rejection names what actually fills the device; None otherwise."""
    s = est.memory
    if not s.act_extra:
        return None
    largest = max(s.act_extra, key=lambda t: t.value)
    name, value = largest.name, largest.value
    return (name, value) if value >= max(0.4 * s.activations, s.block_activations) else None


def why_no_layout_on(plan: Plan, rung: Rung) -> Rejection:
    """Why no layout of ``rung`` was legal: a fixed key that excludes it, or the arithmetic of
    devices, batch and model shape."""
    if rung == Rung.PP_GPIPE and plan.layout.schedule == AUTO:
        return Rejection(rung, Limit.GPIPE_NOT_TRIED, None)
    keys = excluding_keys(plan, rung)
    if keys:
        return Rejection(rung, Limit.EXCLUDED, None, keys=keys)
    world, gb = plan.world_size, plan.train.global_batch
    splits = [
        (tp, pp, dp)
        for tp, pp, dp in space.device_splits(plan)
        if (pp > 1) == rung.pipelined and (tp > 1 if rung.tensor_parallel else rung.pipelined or tp == 1)
    ]
    if not splits:
        if rung.tensor_parallel:
            return Rejection(rung, Limit.NO_TENSOR_SPLIT, None, per_node=plan.hardware.per_node)
        return Rejection(rung, Limit.NO_DEVICE_SPLIT, None, devices=world)
    dps = tuple(sorted({dp for _, _, dp in splits}))
    if all(gb % dp for dp in dps):
        return Rejection(rung, Limit.BATCH_SPLIT, None, devices=world, global_batch=gb, degrees=dps)
    return Rejection(rung, Limit.NO_LEGAL_LAYOUT, None)


def excluding_keys(plan: Plan, rung: Rung) -> tuple[str, ...]:
    """The keys the plan fixes that no layout of ``rung`` can keep, as the plan writes them."""
    lay = plan.layout
    if rung.pipelined and lay.schedule != AUTO and schedule_rung(lay.schedule) != rung:
        return (f"schedule = {lay.schedule}",)
    if rung == Rung.PP_GPIPE:
        return ()
    wanted = {
        "pp": "> 1" if rung.pipelined else "= 1",
        "tp": "> 1" if rung.tensor_parallel else ("= 1" if rung < Rung.TP else None),
    }
    clashes = [
        f"{key} = {getattr(lay, key)}"
        for key, need in wanted.items()
        if need is not None and getattr(lay, key) != AUTO and (getattr(lay, key) > 1) != (need == "> 1")
    ]
    needs = space.needs_more_than_one(plan)
    clashes += [space.fixed_text(plan, key) for degree, key in needs.items() if wanted.get(degree) == "= 1"]
    if (rung == Rung.TP_SP and lay.sequence_parallel is False) or (rung == Rung.TP and lay.sequence_parallel is True):
        clashes.append(space.fixed_text(plan, "sequence_parallel"))
    if rung.data_parallel and lay.zero != AUTO and lay.zero != rung.zero:
        clashes.append(f"zero = {lay.zero}")
    if rung.data_parallel and lay.recompute not in (AUTO, "none"):
        clashes.append(f"recompute = {lay.recompute}")
    if rung.recompute is not None and lay.recompute not in (AUTO, rung.recompute):
        clashes.append(f"recompute = {lay.recompute}")
    return tuple(dict.fromkeys(clashes))
