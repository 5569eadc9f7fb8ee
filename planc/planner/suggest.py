"""When nothing fits: the smallest change to the plan that makes something fit.

Tried in this order, the first that finds a fitting layout wins:

1. a smaller micro-batch, when the plan fixes one;
2. changing the fewest fixed keys: every set of one fixed key is freed (set to ``auto``) and
   searched, then every set of two, and so on (at most :data:`MAX_FREED_SEARCHES` searches);
   among the sets of the smallest size that fit, the one whose simplest fitting layout is fastest.
   The suggestion names the values that layout gives the freed keys ("set recompute = full"),
   so a user changes what must change and keeps the rest of their layout;
3. more devices of the same kind: first more devices in the node up to the device preset's
   server size (a 1-GPU box grows to a 2-, 4-, 8-GPU box, not to "4 nodes × 1"), then more
   such nodes. The plan as written, its fixed keys kept, must be legal and fit there, so that
   following the suggestion does not lead to another refusal; when no cluster tried keeps them
   (tp x pp x dp fixed pin the device count), the smallest one where freeing fixed keys fits,
   with the fewest keys changed, named as in 2.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING

from planc.cost.estimate import Estimate
from planc.cost.profile import PLANC_RUNTIME, RuntimeProfile
from planc.legality.rules import AUTO, fixed
from planc.planner.explore import Candidate, search
from planc.spec.checks import MAX_DEVICES, run_checks
from planc.spec.layout import Layout
from planc.spec.plan import Plan
from planc.spec.presets.hardware import HARDWARE_PRESETS

if TYPE_CHECKING:
    from planc.strategies.registry import Registry

#: Cluster sizes tried (as multiples of the plan's devices) when nothing fits.
GROWTH_FACTORS = (2, 4, 8, 16, 32, 64, 128)
#: Searches spent looking for the fewest fixed keys to change (each a search of a small space:
#: the keys left fixed pin most of the layout).
MAX_FREED_SEARCHES = 64


@dataclass(frozen=True)
class Suggestion:
    """What would fit when nothing does, tried in this order (the first that applies is set)."""

    short_by_bytes: float
    """How much memory per device the layout lacks."""
    micro_batch: int | None = None
    """The largest micro-batch that fits when the plan's own (fixed) one is freed."""
    freed: tuple[tuple[str, object], ...] = ()
    """The fixed keys to change, each with the value the plan gives it."""
    changed: tuple[tuple[str, object], ...] = ()
    """The same keys with the values ``layout`` gives them."""
    layout: Layout | None = None
    nodes: int | None = None
    """The fewest nodes (of ``per_node`` devices) found to fit (with ``changed``, when set)."""
    per_node: int | None = None
    tried_devices: int | None = None
    """The most devices tried without a fit (None: no larger cluster was tried)."""


def suggest_fix(plan: Plan, est: Estimate, registry: Registry, profile: RuntimeProfile = PLANC_RUNTIME) -> Suggestion:
    """What would fit: a smaller micro-batch, changing the fewest fixed keys, or more devices."""
    short = est.memory_bytes - est.capacity
    if fixed(plan.train.micro_batch) and plan.train.micro_batch > 1:
        found = search(_freed(plan, ("micro_batch",)), registry, profile)
        if found.fitting:
            return Suggestion(short, micro_batch=max(c.layout.micro_batch for c in found.fitting))
    change = fewest_keys_to_change(plan, registry, profile)
    if change is not None:
        keys, simplest = change
        # Name every freed key whose value changes: dp too, when it followed tp or pp.
        freed = [*keys, "dp"] if "dp" not in keys and fixed(plan.layout.dp) else list(keys)
        named = [k for k in freed if getattr(simplest.layout, k) != _written(plan, k)]
        return Suggestion(
            short,
            freed=tuple((k, _written(plan, k)) for k in named),
            changed=tuple((k, getattr(simplest.layout, k)) for k in named),
            layout=simplest.layout,
        )
    return _more_devices(plan, registry, profile, short)


def fixed_keys(plan: Plan) -> list[str]:
    """The layout keys (and micro_batch) the plan fixes, as a user would change them: with tp, pp
    and dp all fixed their product is the device count, so dp is not a key of its own -- it
    follows tp and pp (:func:`_freed` frees it with either)."""
    keys = [k for k, v in plan.layout.model_dump().items() if v not in (AUTO, None) and k != "tolerance"]
    if {"tp", "pp", "dp"} <= set(keys):
        keys.remove("dp")
    return keys + (["micro_batch"] if fixed(plan.train.micro_batch) else [])


def fewest_keys_to_change(
    plan: Plan, registry: Registry, profile: RuntimeProfile
) -> tuple[tuple[str, ...], Candidate] | None:
    """The smallest set of fixed keys whose release lets a layout fit, with that set's simplest
    fitting layout (ties between sets of one size: the fastest such layout); None if none is found."""
    keys, searches = fixed_keys(plan), 0
    for size in range(1, len(keys) + 1):
        found: list[tuple[tuple[str, ...], Candidate]] = []
        for subset in combinations(keys, size):
            if searches >= MAX_FREED_SEARCHES:
                return None
            searches += 1
            result = search(_freed(plan, subset), registry, profile)
            if result.fitting:
                found.append((subset, min(result.fitting, key=lambda c: (c.complexity, -c.tokens_per_s))))
        if found:
            return max(found, key=lambda sc: sc[1].tokens_per_s)
    return None


def _freed(plan: Plan, keys: tuple[str, ...]) -> Plan:
    """``plan`` with ``keys`` set to auto."""
    layout_keys = [k for k in keys if k != "micro_batch"]
    if {"tp", "pp"} & set(keys) and all(fixed(getattr(plan.layout, d)) for d in ("tp", "pp", "dp")):
        layout_keys.append("dp")  # the product of the three is the device count
    update: dict[str, object] = {"layout": plan.layout.model_copy(update=freed_values(layout_keys))}
    if "micro_batch" in keys:
        update["train"] = plan.train.model_copy(update={"micro_batch": AUTO})
    return plan.model_copy(update=update)


def freed_values(keys: list[str]) -> dict[str, object]:
    """``keys`` left to the planner: auto, except ``shard_group`` (HSDP): freeing it means unset
    (plain FSDP where dp and zero stay fixed, the planner's choice otherwise)."""
    return {k: None if k == "shard_group" else AUTO for k in keys}


def _written(plan: Plan, key: str) -> object:
    return plan.train.micro_batch if key == "micro_batch" else getattr(plan.layout, key)


def _more_devices(plan: Plan, registry: Registry, profile: RuntimeProfile, short: float) -> Suggestion:
    """The smallest cluster of the plan's devices (up to 128x) on which the plan as written fits:
    more devices per node up to the preset's server size first, then more nodes. When none keeps
    its fixed keys, the smallest on which some layout fits, naming the fixed keys that change."""
    clusters = []
    for nodes, per_node in growth(plan):
        hw = plan.hardware.model_copy(update={"nodes": nodes, "per_node": per_node})
        if hw.world_size > min(plan.train.global_batch * 64, MAX_DEVICES):
            break
        clusters.append(plan.model_copy(update={"hardware": hw}))
    if not clusters:
        return Suggestion(short)
    for bigger in clusters:
        if not run_checks(bigger) and search(bigger, registry, profile).fitting:
            return Suggestion(short, nodes=bigger.hardware.nodes, per_node=bigger.hardware.per_node)
    keys = fixed_keys(plan)
    freed = [*keys, "dp"] if "dp" not in keys and fixed(plan.layout.dp) else keys
    for bigger in clusters:
        fitting = search(_freed(bigger, tuple(keys)), registry, profile).fitting
        if fitting:

            def changes(c: Candidate) -> list[str]:
                return [k for k in freed if getattr(c.layout, k) != _written(plan, k)]

            least = min(fitting, key=lambda c: (len(changes(c)), c.complexity, -c.tokens_per_s))
            named = changes(least)
            return Suggestion(
                short,
                freed=tuple((k, _written(plan, k)) for k in named),
                changed=tuple((k, getattr(least.layout, k)) for k in named),
                nodes=bigger.hardware.nodes,
                per_node=bigger.hardware.per_node,
            )
    return Suggestion(short, tried_devices=clusters[-1].hardware.world_size)


def growth(plan: Plan) -> list[tuple[int, int]]:
    """(nodes, per_node) of the clusters tried, smallest first: the node filled up to the device's
    server size (its preset's per_node, 8 for a GPU without one), then more full nodes."""
    hw = plan.hardware
    server = max(hw.per_node, int(HARDWARE_PRESETS.get(hw.device, {}).get("per_node", 8)))
    sizes = []
    for factor in GROWTH_FACTORS:
        devices = hw.world_size * factor
        if hw.nodes == 1 and devices <= server:
            sizes.append((1, devices))
        else:
            per_node = min(server, devices) if hw.nodes == 1 else hw.per_node
            if devices % per_node == 0:
                sizes.append((devices // per_node, per_node))
    return sizes
