"""The rule: the simplest layout that fits, within a tolerance of the fastest.

1. Score every legal layout (:mod:`planc.planner.explore`).
2. Among those that fit, find the best throughput (tokens/s).
3. Keep those within ``tolerance`` of it (default ``plan.layout.tolerance``, 5%).
4. Pick the one with the smallest complexity rank (:mod:`planc.planner.ladder`); ties go to
   the faster.

For every rung below the chosen one, :class:`Rejection` records the number that ruled it out:
the memory its least-hungry layout needs, or how much slower its fastest fitting layout is and
which part of the step grew. A plan whose layout and micro-batch are all fixed is evaluated as
written, fitting or not. When nothing fits, the least-hungry layout is returned with
``fits=False`` and a suggestion of what would fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planc.cost.context import ContextCache
from planc.cost.estimate import Estimate
from planc.cost.profile import PLANC_RUNTIME, RuntimeProfile
from planc.legality import space
from planc.planner.explore import Candidate, SearchResult, evaluate_layout, search
from planc.planner.ladder import RUNGS, complexity, rung_name, schedule_rung
from planc.spec.checks import MAX_DEVICES
from planc.spec.layout import Layout
from planc.spec.plan import Plan
from planc.units import format_bytes

if TYPE_CHECKING:
    from planc.strategies.registry import Registry


@dataclass(frozen=True)
class Rejection:
    """Why a simpler rung was not chosen."""

    strategy: str
    """The rung, e.g. "DDP", "ZeRO-3 (FSDP)", "+ TP"."""
    reason: str
    """One line with the deciding number."""
    fits: bool | None
    """Whether its best layout fits (None: nothing was scored on this rung)."""
    layout: Layout | None = None
    memory_bytes: float | None = None
    capacity_bytes: float | None = None
    step_s: float | None = None
    slowdown: float | None = None
    """Its step time over the chosen one's."""

    def to_dict(self) -> dict:
        return {
            "strategy": self.strategy,
            "reason": self.reason,
            "fits": self.fits,
            "layout": _layout_dict(self.layout) if self.layout else None,
            "memory_bytes": self.memory_bytes,
            "capacity_bytes": self.capacity_bytes,
            "step_s": self.step_s,
            "slowdown": self.slowdown,
        }


@dataclass(frozen=True)
class Choice:
    """The planner's answer for one plan."""

    layout: Layout
    estimate: Estimate
    fits: bool
    rejected: tuple[Rejection, ...]
    alternatives: tuple[Candidate, ...]
    tolerance: float
    rung: str
    """Name of the chosen layout's rung on the ladder."""
    fixed: bool = False
    """The plan fixed every layout key: evaluated as given."""
    suggestion: str | None = None
    """When nothing fits: what would."""
    best: Candidate | None = None
    """The fastest fitting layout (may equal the chosen one)."""
    scored: int = 1
    search_seconds: float = 0.0


def is_fully_fixed(plan: Plan) -> bool:
    """True when the plan leaves nothing for the planner to choose."""
    lay, auto = plan.layout, "auto"
    core = (lay.tp, lay.pp, lay.dp, lay.zero, lay.recompute, plan.train.micro_batch)
    if auto in core:
        return False
    if lay.pp > 1 and lay.schedule == auto:
        return False
    if lay.pp > 1 and lay.schedule in ("interleaved", "zero-bubble") and lay.virtual_stages == auto:
        return False
    return not (lay.tp > 1 and lay.sequence_parallel == auto)


def fixed_layout(plan: Plan) -> Layout:
    lay = plan.layout
    pp = lay.pp
    schedule = None if pp == 1 else lay.schedule
    v = lay.virtual_stages if (lay.virtual_stages != "auto" and schedule in ("interleaved", "zero-bubble")) else 1
    sp = bool(lay.sequence_parallel is True and lay.tp > 1)
    return Layout(
        tp=lay.tp,
        pp=pp,
        dp=lay.dp,
        zero=lay.zero,
        recompute=lay.recompute,
        schedule=schedule,
        micro_batch=plan.train.micro_batch,
        virtual_stages=v,
        sequence_parallel=sp,
    )


def choose(
    plan: Plan,
    registry: Registry,
    *,
    tolerance: float | None = None,
    top_k: int = 5,
    profile: RuntimeProfile = PLANC_RUNTIME,
) -> Choice:
    """Pick the layout for ``plan``: the simplest that fits, within ``tolerance`` of the best."""
    tol = plan.layout.tolerance if tolerance is None else tolerance
    cache = ContextCache(plan, profile)
    if is_fully_fixed(plan):
        layout = fixed_layout(plan)
        est = evaluate_layout(plan, layout, registry, cache)
        suggestion = None if est.fits else suggest_fix(plan, est, registry, profile)
        return Choice(
            layout=layout,
            estimate=est,
            fits=est.fits,
            rejected=(),
            alternatives=(),
            tolerance=tol,
            rung=rung_name(complexity(layout)[0]),
            fixed=True,
            suggestion=suggestion,
        )

    result = search(plan, registry, profile, cache)
    if not result.fitting:
        return _nothing_fits(plan, registry, result, tol, profile)

    best = max(result.fitting, key=lambda c: c.tokens_per_s)
    floor = best.tokens_per_s * (1.0 - tol)
    eligible = [c for c in result.fitting if c.tokens_per_s >= floor]
    chosen = min(eligible, key=lambda c: (c.complexity, -c.tokens_per_s))
    rejected = tuple(_rejections(plan, result, chosen, best, tol))
    alternatives = tuple(sorted((c for c in result.fitting if c is not chosen), key=lambda c: -c.tokens_per_s)[:top_k])
    return Choice(
        layout=chosen.layout,
        estimate=chosen.estimate,
        fits=True,
        rejected=rejected,
        alternatives=alternatives,
        tolerance=tol,
        rung=rung_name(chosen.rung),
        best=best,
        scored=result.scored,
        search_seconds=result.seconds,
    )


# -- why not simpler ---------------------------------------------------------------------------


def _rejections(
    plan: Plan, result: SearchResult, chosen: Candidate, best: Candidate | None, tol: float
) -> list[Rejection]:
    fastest: dict[int, Candidate] = {}
    for c in result.fitting:
        if c.rung not in fastest or c.tokens_per_s > fastest[c.rung].tokens_per_s:
            fastest[c.rung] = c
    world = chosen.estimate.world_size
    cap = chosen.estimate.capacity
    rows = []
    for rung in range(chosen.rung):
        name = RUNGS[rung]
        if rung == 0 and world > 1:
            continue  # one device of many is not a layout
        if rung in fastest:
            rows.append(_slower(name, fastest[rung], chosen, best, tol))
            continue
        miss = _closest_miss(result, rung)
        if miss is not None:
            memory, text, layout, est = miss
            rows.append(
                Rejection(
                    name,
                    text,
                    fits=False,
                    layout=layout,
                    memory_bytes=memory,
                    capacity_bytes=cap,
                    step_s=est.step_s if est else None,
                )
            )
        elif rung in result.refused:
            rows.append(Rejection(name, f"refused by {result.refused[rung]}", fits=None))
        elif rung in result.dominated:
            rows.append(
                Rejection(name, "not needed: less recomputation fits the same micro-batch and is faster", fits=None)
            )
        else:
            rows.append(Rejection(name, _why_no_layout(plan, rung), fits=None))
    return rows


def _closest_miss(result: SearchResult, rung: int):
    """(memory, reason, layout, estimate) of the rung's nearest miss, or None."""
    options = []
    if rung in result.tightest_misfit:
        c = result.tightest_misfit[rung]
        if c.rung == rung:
            est = c.estimate
            options.append(
                (
                    est.memory_bytes,
                    f"needs {_gib(est.memory_bytes)} per device, has {_gib(est.capacity)} "
                    f"({_biggest_memory_part(est)}) — best try: {c.layout.describe()}",
                    c.layout,
                    est,
                )
            )
    if rung in result.family_bound:
        c = result.family_bound[rung]
        est = c.estimate
        options.append(
            (
                est.memory_bytes,
                f"needs at least {_gib(est.memory_bytes)} per device, has "
                f"{_gib(est.capacity)}: even {c.layout.describe()} does not fit "
                f"({_biggest_memory_part(est)})",
                c.layout,
                est,
            )
        )
    if rung in result.states_bound:
        bound, layout = result.states_bound[rung]
        options.append(
            (bound, f"model states alone need {_gib(bound)} per device — best try: {_family(layout)}", layout, None)
        )
    return min(options, key=lambda o: o[0]) if options else None


def _why_no_layout(plan: Plan, rung: int) -> str:
    """Why no layout of ``rung`` was legal: a fixed key that excludes it, or the arithmetic of
    devices, batch and model shape."""
    lay = plan.layout
    if rung >= 9 and lay.schedule != "auto" and schedule_rung(lay.schedule) != rung:
        return f"excluded by the plan: it fixes schedule = {lay.schedule}"
    if rung == 10:
        return "not tried: GPipe has 1F1B's bubble and holds all micro-batches (set schedule = gpipe to try it)"
    pipelined, tensor = rung >= 9, rung in (7, 8)
    wanted = {"pp": "> 1" if pipelined else "= 1", "tp": "> 1" if tensor else ("= 1" if rung <= 6 else None)}
    clashes = [
        f"{key} = {getattr(lay, key)}"
        for key, need in wanted.items()
        if need is not None and getattr(lay, key) != "auto" and (getattr(lay, key) > 1) != (need == "> 1")
    ]
    needs = space.needs_more_than_one(plan)
    clashes += [space.fixed_text(plan, key) for degree, key in needs.items() if wanted.get(degree) == "= 1"]
    if (rung == 8 and lay.sequence_parallel is False) or (rung == 7 and lay.sequence_parallel is True):
        clashes.append(space.fixed_text(plan, "sequence_parallel"))
    if 1 <= rung <= 4 and lay.zero != "auto" and lay.zero != rung - 1:
        clashes.append(f"zero = {lay.zero}")
    if 1 <= rung <= 4 and lay.recompute not in ("auto", "none"):
        clashes.append(f"recompute = {lay.recompute}")
    if 5 <= rung <= 6 and lay.recompute not in ("auto", ("selective", "full")[rung - 5]):
        clashes.append(f"recompute = {lay.recompute}")
    if clashes:
        return f"excluded by the plan: it fixes {' and '.join(dict.fromkeys(clashes))}"
    world, gb = plan.world_size, plan.train.global_batch
    splits = [
        (tp, pp, dp)
        for tp, pp, dp in space.device_splits(plan)
        if (pp > 1) == pipelined and (tp > 1 if tensor else rung >= 9 or tp == 1)
    ]
    if not splits:
        if tensor:
            return (
                f"not possible: no tp > 1 that divides per_node = {plan.hardware.per_node} also divides "
                f"heads, kv_heads, ffn and the padded vocabulary"
            )
        return f"not possible: no legal split of the {world} devices without pipeline stages"
    dps = sorted({dp for _, _, dp in splits})
    if all(gb % dp for dp in dps):
        shown = " or ".join(map(str, dps))
        how = "without pipelining" if tensor else "by data parallelism alone"
        more = (
            f", more than global_batch = {gb} sequences"
            if all(dp > gb for dp in dps)
            else f", which does not divide global_batch = {gb}"
        )
        return f"not possible: covering the {world} devices {how} needs dp = {shown}{more}"
    return "no legal layout on this rung (the plan's fixed layout keys, divisibility or device count)"


def _slower(name: str, c: Candidate, chosen: Candidate, best: Candidate | None, tol: float) -> Rejection:
    est, ref = c.estimate, chosen.estimate
    ratio = est.step_s / ref.step_s
    if ratio >= 1.0:
        amount = f"{ratio:.1f}× slower" if ratio >= 1.5 else f"{(ratio - 1) * 100:.0f}% slower"
        vs_best = ""
        if best is not None and best is not chosen and ratio < 1.0 / (1.0 - tol):
            lag = 1.0 - c.tokens_per_s / best.tokens_per_s
            vs_best = f", {lag * 100:.0f}% behind the fastest layout (tolerance {tol * 100:.0f}%)"
        reason = (
            f"fits ({_gib(est.memory_bytes)}) but {amount}{vs_best}: step {_sec(est.step_s)} vs "
            f"{_sec(ref.step_s)}{_grown_part(est, ref)} — {c.layout.describe()}"
        )
    else:
        reason = (
            f"fits ({_gib(est.memory_bytes)}), {(1 - ratio) * 100:.0f}% faster, but the chosen layout is "
            f"simpler and within the tolerance — {c.layout.describe()}"
        )
    return Rejection(
        name,
        reason,
        fits=True,
        layout=c.layout,
        memory_bytes=est.memory_bytes,
        capacity_bytes=est.capacity,
        step_s=est.step_s,
        slowdown=ratio,
    )


def step_parts(est: Estimate) -> dict[str, float]:
    """The step time split into named parts (seconds)."""
    parts = {
        "compute": est.compute - est.recompute,
        "recompute": est.recompute,
        "bubble": est.bubble,
        "optimizer": est.optimizer,
    }
    for c in est.comm:
        parts[f"{c.group.upper()} exposed"] = c.exposed
    for t in est.other:
        parts[t.name] = t.value
    return parts


def _grown_part(est: Estimate, ref: Estimate) -> str:
    a, b = step_parts(est), step_parts(ref)
    deltas = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in set(a) | set(b)}
    key, delta = max(deltas.items(), key=lambda kv: kv[1])
    if delta <= 0:
        return ""
    return f" ({key} {_sec(a.get(key, 0.0))})"


def _biggest_memory_part(est: Estimate) -> str:
    s = est.memory
    parts = {"model states": s.model_states, "activations": s.activations, "buffers": s.transient_bytes}
    key = max(parts, key=parts.get)
    return f"{key} {_gib(parts[key])}"


def _family(layout: Layout) -> str:
    text = f"TP {layout.tp} × PP {layout.pp} × DP {layout.dp}"
    if layout.dp > 1:
        text += " · " + {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3/FSDP"}[layout.zero]
    return text


# -- nothing fits ------------------------------------------------------------------------------


def _nothing_fits(plan: Plan, registry: Registry, result: SearchResult, tol: float, profile: RuntimeProfile) -> Choice:
    misfits = list(result.tightest_misfit.values()) + list(result.family_bound.values())
    if misfits:
        least = min(misfits, key=lambda c: c.estimate.memory_bytes)
        layout, est = least.layout, least.estimate
    else:  # every family was ruled out by its model states: score the least-hungry one
        bound, layout = min(result.states_bound.values(), key=lambda bl: bl[0]) if result.states_bound else (0.0, None)
        if layout is None:
            raise NoLegalLayout(plan, next(iter(result.refused.values()), None))
        est = evaluate_layout(plan, layout, registry, ContextCache(plan, profile))
    suggestion = suggest_fix(plan, est, registry, profile)
    rejected = tuple(_rejections(plan, result, Candidate(layout, est, complexity(layout)), None, tol))
    return Choice(
        layout=layout,
        estimate=est,
        fits=False,
        rejected=rejected,
        alternatives=(),
        tolerance=tol,
        rung=rung_name(complexity(layout)[0]),
        suggestion=suggestion,
        scored=result.scored,
        search_seconds=result.seconds,
    )


class NoLegalLayout(Exception):
    """The plan's fixed keys and divisibility leave no layout at all (``planc check`` reports the
    same through :func:`~planc.legality.why_no_layout`; this catches plans built otherwise)."""

    def __init__(self, plan: Plan, refusal: str | None = None) -> None:
        from planc.legality.space import why_no_layout

        issue = why_no_layout(plan)
        if issue is None and refusal is not None:
            super().__init__(f"no legal layout: every layout was refused, e.g. by {refusal}")
            self.hint = "change the use block's options or the fixed layout keys, or remove the use block"
            return
        what = issue.message if issue else f"no legal layout for {plan.world_size} devices"
        super().__init__(f"{what} ({'.'.join(map(str, issue.path))})" if issue and issue.path else what)
        self.hint = issue.hint if issue else "set some layout keys to auto, or change the device count"


def suggest_fix(plan: Plan, est: Estimate, registry: Registry, profile: RuntimeProfile = PLANC_RUNTIME) -> str:
    """What would fit: a smaller micro-batch, freeing fixed keys, or more devices."""
    short = f"short by {_gib(est.memory_bytes - est.capacity)} per device"
    if plan.train.micro_batch != "auto" and plan.train.micro_batch > 1:
        freed = plan.model_copy(update={"train": plan.train.model_copy(update={"micro_batch": "auto"})})
        found = search(freed, registry, profile)
        if found.fitting:
            mb = max(c.layout.micro_batch for c in found.fitting)
            return f"{short}; micro_batch = {mb} (or smaller) would fit"
    fixed = {k: v for k, v in plan.layout.model_dump().items() if v != "auto" and k != "tolerance"}
    if fixed:
        freed = plan.model_copy(update={"layout": plan.layout.model_copy(update={k: "auto" for k in fixed})})
        found = search(freed, registry, profile)
        if found.fitting:
            c = min(found.fitting, key=lambda c: (c.complexity, -c.tokens_per_s))
            keys = ", ".join(f"{k} = {v}" for k, v in fixed.items())
            return f"{short}; without the fixed {keys}: {c.layout.describe()} fits"
    tried = plan.hardware.world_size
    for factor in (2, 4, 8, 16, 32, 64, 128):
        hw = plan.hardware.model_copy(update={"nodes": plan.hardware.nodes * factor})
        if hw.world_size > min(plan.train.global_batch * 64, MAX_DEVICES):
            break
        tried = hw.world_size
        bigger = plan.model_copy(
            update={"hardware": hw, "layout": plan.layout.model_copy(update={k: "auto" for k in ("tp", "pp", "dp")})}
        )
        found = search(bigger, registry, profile)
        if found.fitting:
            return (
                f"{short}; the smallest device count found to fit is {hw.world_size} devices "
                f"({hw.nodes} nodes × {hw.per_node})"
            )
    if tried == plan.hardware.world_size:
        return f"{short}; use a device with more memory, or fewer fixed layout keys"
    return f"{short}; no layout fits even on {tried} devices — use a device with more memory"


def _layout_dict(layout: Layout) -> dict:
    return {
        k: getattr(layout, k)
        for k in (
            "tp",
            "pp",
            "dp",
            "zero",
            "recompute",
            "schedule",
            "micro_batch",
            "virtual_stages",
            "sequence_parallel",
        )
    }


def _gib(n: float) -> str:
    return format_bytes(n)


def _sec(s: float) -> str:
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1000:.0f} ms"
