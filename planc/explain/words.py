"""The planner's findings in words: why a rung was rejected, what would fit.

The planner returns data (:class:`~planc.planner.rejections.Rejection`,
:class:`~planc.planner.choose.Suggestion`); this module words them, with the unit formatters of
:mod:`planc.units` that the rest of ``planc explain`` uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planc.planner.rejections import Limit, Rejection
from planc.planner.suggest import Suggestion
from planc.spec.layout import Layout
from planc.units import format_bytes, format_percent, format_percent_fine, format_seconds

LAYOUT_KEYS = ("tp", "pp", "dp", "zero", "recompute", "schedule", "micro_batch", "virtual_stages", "sequence_parallel")


def layout_dict(layout: Layout) -> dict[str, Any]:
    """The resolved layout keys (what ``--json`` shows of a layout)."""
    shown = {k: getattr(layout, k) for k in LAYOUT_KEYS}
    if layout.shard_group is not None:  # HSDP: only when the layout uses it
        shown["shard_group"] = layout.shard_group
    return shown


def rejection_reason(r: Rejection) -> str:
    """One line with the deciding number, e.g. "needs 2.7 TiB per device, has 80.0 GiB (...)"."""
    return _REASONS[r.limit](r)


def rejection_dict(r: Rejection) -> dict[str, Any]:
    """A rejection as ``--json`` shows it: the rung, the limit, the numbers and the reason in words."""
    return {
        "strategy": r.strategy,
        "reason": rejection_reason(r),
        "fits": r.fits,
        "layout": layout_dict(r.layout) if r.layout else None,
        "memory_bytes": r.memory_bytes,
        "capacity_bytes": r.capacity_bytes,
        "step_s": r.step_s,
        "slowdown": r.slowdown,
        "limit": r.limit.value,
    }


def _family(layout: Layout) -> str:
    """``TP 8 × PP 1 × DP 16 · ZeRO-1``: the degrees and the data parallelism of a layout family."""
    text = f"TP {layout.tp} × PP {layout.pp} × DP {layout.dp}"
    if layout.dp > 1:
        text += " · " + {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3/FSDP"}[layout.zero]
    if layout.recompute != "none":  # the family on a recompute rung: say so, as the row is about it
        text += f" · {layout.recompute} recompute"
    return text


def _part(r: Rejection) -> str:
    part, detail = r.memory_part, r.memory_detail
    text = f"{part[0]} {format_bytes(part[1])}" if part else ""
    return text + (f", most of it {detail[0]} {format_bytes(detail[1])}" if detail else "")


def _memory(r: Rejection) -> str:
    assert r.layout is not None and r.memory_bytes is not None and r.capacity_bytes is not None
    return (
        f"needs {format_bytes(r.memory_bytes)} per device, has {format_bytes(r.capacity_bytes)} "
        f"({_part(r)}) — best try: {r.layout.describe()}"
    )


def _family_memory(r: Rejection) -> str:
    assert r.layout is not None and r.memory_bytes is not None and r.capacity_bytes is not None
    return (
        f"needs at least {format_bytes(r.memory_bytes)} per device, has {format_bytes(r.capacity_bytes)}: "
        f"even {r.layout.describe()} does not fit ({_part(r)})"
    )


def _model_states(r: Rejection) -> str:
    """The model states themselves (not the bound, which adds the CUDA context): what the words say."""
    assert r.layout is not None and r.memory_bytes is not None
    states = r.memory_part[1] if r.memory_part else r.memory_bytes
    return f"model states alone need {format_bytes(states)} per device — best try: {_family(r.layout)}"


def _slower(r: Rejection) -> str:
    assert r.layout is not None and r.slowdown is not None and r.step_s is not None and r.chosen_step_s is not None
    ratio = r.slowdown
    if ratio >= 1e4:  # a link or a device priced absurdly slow: digits nobody reads
        amount = f"{ratio:.3g}× slower"
    else:
        amount = f"{ratio:.1f}× slower" if ratio >= 1.5 else f"{format_percent(ratio - 1)} slower"
    behind = ""
    if r.behind_best is not None and r.tolerance is not None:
        margin = format_percent_fine(r.tolerance)
        behind = f", {format_percent_fine(r.behind_best)} behind the fastest layout (margin {margin})"
    if r.alike and r.chosen_memory_bytes is not None:
        behind = (
            f", and ranks with the chosen layout (sequence parallelism adds no complexity to TP), which"
            f" needs {format_bytes(r.chosen_memory_bytes)}"
        )
    grown = f" ({r.grown[0]} {format_seconds(r.grown[1])})" if r.grown else ""
    return (
        f"fits ({format_bytes(r.memory_bytes or 0.0)}) but {amount}{behind}: step {format_seconds(r.step_s)} vs "
        f"{format_seconds(r.chosen_step_s)}{grown} — {r.layout.describe()}"
    )


def _within_tolerance(r: Rejection) -> str:
    assert r.layout is not None and r.slowdown is not None
    return (
        f"fits ({format_bytes(r.memory_bytes or 0.0)}), {format_percent(1 - r.slowdown)} faster, but the chosen "
        f"layout is simpler and within the tolerance — {r.layout.describe()}"
    )


def _batch_split(r: Rejection) -> str:
    shown = " or ".join(map(str, r.degrees))
    how = "without pipelining" if r.rung.tensor_parallel else "by data parallelism alone"
    gb = r.global_batch
    more = (
        f", more than global_batch = {gb} sequences"
        if all(gb is not None and dp > gb for dp in r.degrees)
        else f", which does not divide global_batch = {gb}"
    )
    return f"not possible: covering the {r.devices} devices {how} needs dp = {shown}{more}"


_REASONS: dict[Limit, Callable[[Rejection], str]] = {
    Limit.MEMORY: _memory,
    Limit.FAMILY_MEMORY: _family_memory,
    Limit.MODEL_STATES: _model_states,
    Limit.SLOWER: _slower,
    Limit.WITHIN_TOLERANCE: _within_tolerance,
    Limit.REFUSED: lambda r: f"refused by {r.refusal}",
    Limit.DOMINATED: lambda r: "not needed: less recomputation fits the same micro-batch and is faster",
    Limit.EXCLUDED: lambda r: f"excluded by the plan: it fixes {' and '.join(r.keys)}",
    Limit.GPIPE_NOT_TRIED: lambda r: (
        "not tried: GPipe has 1F1B's bubble and holds all micro-batches (set schedule = gpipe to try it)"
    ),
    Limit.NO_TENSOR_SPLIT: lambda r: (
        f"not possible: no tp > 1 that divides per_node = {r.per_node} also divides "
        "heads, kv_heads, ffn and the padded vocabulary"
    ),
    Limit.NO_DEVICE_SPLIT: lambda r: f"not possible: no legal split of the {r.devices} devices without pipeline stages",
    Limit.BATCH_SPLIT: _batch_split,
    Limit.NO_LEGAL_LAYOUT: lambda r: (
        "no legal layout on this rung (the plan's fixed layout keys, divisibility or device count)"
    ),
}


def plan_value(value: object) -> str:
    """A value as the plan language writes it: ``true``/``false``, ``none``, words and numbers."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else str(value)


def _changed_keys(s: Suggestion) -> str:
    """``tp = 8 (not 1) and dp = 2 (not 8)``: the fixed keys a suggestion changes."""
    was = dict(s.freed)
    each = [f"{k} = {plan_value(v)} (not {plan_value(was[k])})" for k, v in s.changed]
    return " and ".join([", ".join(each[:-1]), each[-1]] if len(each) > 2 else each)


def suggestion_text(s: Suggestion) -> str:
    """What would fit, e.g. "short by 3.1 GiB per device; micro_batch = 2 (or smaller) would fit"."""
    short = f"short by {format_bytes(s.short_by_bytes)} per device"
    if s.micro_batch is not None:
        return f"{short}; micro_batch = {s.micro_batch} (or smaller) would fit"
    if s.layout is not None:
        return f"{short}; set {_changed_keys(s)} and it fits: {s.layout.describe()}"
    if s.nodes is not None:
        devices = s.nodes * (s.per_node or 1)
        where = f"{s.nodes} nodes × {s.per_node}" if s.nodes > 1 else f"one node of {s.per_node}"
        if s.changed:  # the plan's fixed keys fit no cluster tried: these must change too
            return (
                f"{short}; no cluster tried fits the fixed layout keys; the smallest found to fit has "
                f"{devices} devices ({where}) with {_changed_keys(s)}"
            )
        return f"{short}; the smallest cluster found to fit the plan as written has {devices} devices ({where})"
    if s.tried_devices is None:
        return f"{short}; use a device with more memory, or fewer fixed layout keys"
    return f"{short}; no layout fits even on {s.tried_devices} devices — use a device with more memory"
