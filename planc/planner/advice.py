"""What an experienced engineer would tell the plan's author after the choice: warnings and hints,
as data (:mod:`planc.explain.advice_words` words them; ``planc explain`` prints them as notes).

- a layout past every published check of sharded data parallelism: set aside, or chosen because
  nothing checked fits;
- a faster, more complex layout left out because its gain is within the model's margin;
- memory close to the limit, or a misfit only because of the headroom;
- a global batch that no good layout divides, and the nearby batch that one would;
- far more devices than the model and batch can use;
- a fixed layout key that costs much, and what freeing it would gain;
- an ``inter_node_bw`` that looks like a per-node figure.

Each check that searches again (batch, devices, fixed keys) runs only when a cheap test says it
may apply, so a plain ``planc explain`` pays for none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planc.cost.profile import PLANC_RUNTIME, RuntimeProfile
from planc.legality.rules import AUTO
from planc.planner.checked import sharded_regime, unchecked
from planc.planner.choose import Choice, pick
from planc.planner.explore import Candidate, search
from planc.planner.ladder import complexity, rung_name
from planc.planner.margin import Margin
from planc.planner.suggest import freed_values
from planc.spec.layout import Layout
from planc.spec.plan import Plan

if TYPE_CHECKING:
    from planc.strategies.registry import Registry

#: Memory above this fraction of the capacity (memory less headroom) is "close to the limit".
CLOSE_TO_LIMIT = 0.9
#: Model FLOP utilisation below which a GPU plan is told it has more devices than it can use.
LOW_MFU = 0.15
#: A nearby global batch is tried up to this fraction away from the plan's.
NEARBY_BATCH = 0.1
#: One network port per device today is at most 800 Gb/s (ConnectX-8) = 100 GB/s one direction;
#: more than that per device is almost surely a per-node figure.
MAX_NIC_PER_DEVICE = 100e9
#: Layout keys whose cost is measured by freeing them.
LAYOUT_KEYS = ("tp", "pp", "dp", "zero", "recompute", "schedule", "virtual_stages", "sequence_parallel")


@dataclass(frozen=True)
class Advice:
    """One warning or hint. ``kind`` says which; the other fields carry its numbers."""

    kind: str
    """unchecked | within_margin | close_to_limit | headroom | batch | devices | fixed_key | per_node_network"""
    layout: Layout | None = None
    """The layout the advice points at (the faster one, the roomier one, the freed one)."""
    rung: str | None = None
    chosen_rung: str | None = None
    gain: float | None = None
    """Throughput ratio of the pointed-at layout over the chosen one (1.41 = 41% faster)."""
    seconds: float | None = None
    """Step time saved (within_margin)."""
    margin: Margin | None = None
    memory_bytes: float | None = None
    capacity_bytes: float | None = None
    other_memory_bytes: float | None = None
    value: int | None = None
    """batch: the suggested global batch; devices: the suggested device count."""
    mfu: float | None = None
    other_mfu: float | None = None
    keys: tuple[str, ...] = ()
    """fixed_key: the keys freed, as the plan writes them."""
    bandwidth: float | None = None
    regime: tuple[int, float] | None = None
    """unchecked: (shard ranks, data-parallel traffic / compute) of the layout past the published checks."""
    fixed: bool = False
    """unchecked: the plan fixed the layout (the planner did not choose it)."""
    tie: bool = False
    """within_margin: the faster layout is as simple as the chosen one (a speed tie that went to memory)."""


def advise(
    plan: Plan, choice: Choice, registry: Registry, profile: RuntimeProfile = PLANC_RUNTIME
) -> tuple[Advice, ...]:
    """Every piece of advice for ``plan`` and its ``choice``, most important first."""
    found: list[Advice | None] = [
        unchecked_regime(plan, choice),
        within_margin(choice),
        close_to_limit(choice),
        fits_without_headroom(plan, choice),
        per_node_network(plan),
    ]
    if choice.fits:
        found += [nearby_batch(plan, choice, registry, profile), too_many_devices(plan, choice, registry, profile)]
        found += fixed_keys(plan, choice, registry, profile)
    return tuple(a for a in found if a is not None)


def unchecked_regime(plan: Plan, choice: Choice) -> Advice | None:
    """The layout the rule would have picked, set aside because it shards data parallelism past every
    published check; or the chosen layout itself past them (nothing checked fits, or the plan fixed it)."""
    if choice.set_aside is not None:
        other = choice.set_aside
        return Advice(
            "unchecked",
            layout=other.layout,
            gain=other.tokens_per_s / choice.estimate.tokens_per_s,
            regime=sharded_regime(other.layout, other.estimate),
        )
    if (choice.fits or choice.fixed) and unchecked(plan, choice.layout, choice.estimate):
        # (a least-hungry misfit is no choice to be sure of: its suggestion is what explain shows)
        return Advice("unchecked", regime=sharded_regime(choice.layout, choice.estimate), fixed=choice.fixed)
    return None


def within_margin(choice: Choice) -> Advice | None:
    """The fastest layout, when the rule chose a simpler one over it."""
    best, margin = choice.best, choice.margin
    if best is None or margin is None or best.layout == choice.layout:
        return None
    est = choice.estimate
    saved = est.step_s - best.estimate.step_s
    if saved <= 0:
        return None
    return Advice(
        "within_margin",
        layout=best.layout,
        rung=rung_name(best.layout),
        chosen_rung=rung_name(choice.layout),
        gain=best.tokens_per_s / est.tokens_per_s,
        seconds=saved,
        margin=margin,
        memory_bytes=est.memory_bytes,
        other_memory_bytes=best.estimate.memory_bytes,
        tie=complexity(best.layout) == complexity(choice.layout),
    )


def close_to_limit(choice: Choice) -> Advice | None:
    """Memory above :data:`CLOSE_TO_LIMIT` of the capacity, with the roomiest alternative."""
    est = choice.estimate
    if not choice.fits or est.memory_bytes <= CLOSE_TO_LIMIT * est.capacity:
        return None
    roomy = [a for a in choice.alternatives if a.estimate.memory_bytes <= CLOSE_TO_LIMIT * est.capacity]
    other = max(roomy, key=lambda a: a.tokens_per_s) if roomy else None
    return Advice(
        "close_to_limit",
        layout=other.layout if other else None,
        gain=other.tokens_per_s / est.tokens_per_s if other else None,
        memory_bytes=est.memory_bytes,
        capacity_bytes=est.capacity,
        other_memory_bytes=other.estimate.memory_bytes if other else None,
    )


def fits_without_headroom(plan: Plan, choice: Choice) -> Advice | None:
    """Nothing fits the capacity, but the returned layout fits the device's whole memory."""
    est, hw = choice.estimate, plan.hardware
    if choice.fits or not hw.headroom or est.memory_bytes > hw.memory:
        return None
    return Advice("headroom", layout=choice.layout, memory_bytes=est.memory_bytes, capacity_bytes=hw.memory)


def per_node_network(plan: Plan) -> Advice | None:
    """``inter_node_bw`` above any one NIC's rate, or above the NVLink figure: likely per node."""
    hw = plan.hardware
    if hw.nodes == 1 or hw.is_cpu:
        return None
    if hw.inter_node_bw > MAX_NIC_PER_DEVICE or hw.inter_node_bw > hw.intra_node_bw:
        return Advice("per_node_network", bandwidth=hw.inter_node_bw, value=hw.per_node)
    return None


def _best_chosen(plan: Plan, registry: Registry, profile: RuntimeProfile, margin: Margin) -> Candidate | None:
    found = search(plan, registry, profile)
    if not found.fitting:
        return None
    best = max(found.fitting, key=lambda c: c.tokens_per_s)
    return pick(found.fitting, best, margin)


def nearby_batch(plan: Plan, choice: Choice, registry: Registry, profile: RuntimeProfile) -> Advice | None:
    """When the global batch does not divide over the devices, the nearest batches that do."""
    gb, world = plan.train.global_batch, plan.world_size
    if gb % world == 0 or choice.margin is None or not _layout_auto(plan, "dp"):
        return None
    below, above = gb - gb % world, gb - gb % world + world
    tries = sorted(
        (b for b in (above, below) if b > 0 and abs(b - gb) <= max(1, NEARBY_BATCH * gb)), key=lambda b: abs(b - gb)
    )
    best: tuple[int, Candidate] | None = None
    for batch in tries:  # the nearest batch that beats the margin
        other = plan.model_copy(update={"train": plan.train.model_copy(update={"global_batch": batch})})
        c = _best_chosen(other, registry, profile, choice.margin)
        if c is not None and _beats(c, choice):
            best = (batch, c)
            break
    if best is None:
        return None
    batch, c = best
    return Advice(
        "batch",
        layout=c.layout,
        rung=rung_name(c.layout),
        gain=c.tokens_per_s / choice.estimate.tokens_per_s,
        value=batch,
    )


def too_many_devices(plan: Plan, choice: Choice, registry: Registry, profile: RuntimeProfile) -> Advice | None:
    """MFU below :data:`LOW_MFU` on many GPUs: the fewest node count that keeps 90% of the speed,
    or, when even half the nodes keep less, what half would keep -- the trade the user weighs
    (GPT-2 on 1024 A100s: the warning named no device count at all)."""
    est, hw = choice.estimate, plan.hardware
    if hw.is_cpu or est.mfu >= LOW_MFU or plan.world_size <= hw.per_node or choice.margin is None:
        return None
    if not all(_layout_auto(plan, k) for k in ("dp",)):
        return None
    fewer: tuple[int, Candidate] | None = None
    nodes = hw.nodes // 2
    while nodes >= 1:
        smaller = plan.model_copy(update={"hardware": hw.model_copy(update={"nodes": nodes})})
        c = _best_chosen(smaller, registry, profile, choice.margin)
        if c is None:
            break
        if c.tokens_per_s < 0.9 * est.tokens_per_s:
            if fewer is None and nodes == hw.nodes // 2:
                fewer = (nodes * hw.per_node, c)  # half keeps less than 90%: say how much
            break
        fewer = (nodes * hw.per_node, c)
        nodes //= 2
    return Advice(
        "devices",
        layout=fewer[1].layout if fewer else None,
        gain=fewer[1].tokens_per_s / est.tokens_per_s if fewer else None,
        value=fewer[0] if fewer else None,
        mfu=est.mfu,
        other_mfu=fewer[1].estimate.mfu if fewer else None,
    )


def fixed_keys(plan: Plan, choice: Choice, registry: Registry, profile: RuntimeProfile) -> list[Advice]:
    """For the plan's fixed layout keys: what freeing them gains, when it beats the margin."""
    fixed = [k for k in LAYOUT_KEYS if getattr(plan.layout, k) not in (AUTO, None)]
    if not fixed or choice.margin is None:
        return []
    freed_all = _free(plan, fixed)
    c = _best_chosen(freed_all, registry, profile, choice.margin)
    if c is None or not _beats(c, choice):
        return []
    single = []
    for key in fixed:
        one = _best_chosen(_free(plan, [key]), registry, profile, choice.margin)
        if one is not None and _beats(one, choice):
            single.append((key, one))
    if single:
        return [_fixed_advice(plan, [key], one, choice) for key, one in single]
    return [_fixed_advice(plan, fixed, c, choice)]


def _fixed_advice(plan: Plan, keys: list[str], c: Candidate, choice: Choice) -> Advice:
    written = tuple(f"{k} = {_written(getattr(plan.layout, k))}" for k in keys)
    return Advice(
        "fixed_key",
        layout=c.layout,
        rung=rung_name(c.layout),
        gain=c.tokens_per_s / choice.estimate.tokens_per_s,
        keys=written,
    )


def _written(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _free(plan: Plan, keys: list[str]) -> Plan:
    return plan.model_copy(update={"layout": plan.layout.model_copy(update=freed_values(keys))})


def _layout_auto(plan: Plan, key: str) -> bool:
    return getattr(plan.layout, key) == AUTO


def _beats(c: Candidate, choice: Choice) -> bool:
    """Whether ``c`` is faster than the chosen layout by more than the margin (per token)."""
    assert choice.margin is not None
    # Per-token time, so a plan with another batch compares fairly.
    mine, theirs = 1.0 / choice.estimate.tokens_per_s, 1.0 / c.tokens_per_s
    steps = choice.estimate.tokens_per_step
    return not choice.margin.within(mine * steps, theirs * steps)
