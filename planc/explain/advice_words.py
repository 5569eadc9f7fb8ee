"""The planner's advice (:mod:`planc.planner.advice`) in words, for explain's notes and ``--json``."""

from __future__ import annotations

from planc.cost.uncertainty import sharded_dp_beyond
from planc.planner.advice import Advice
from planc.planner.checked import widest_checked
from planc.planner.margin import TIE_BAND
from planc.units import format_bandwidth, format_bytes, format_percent_fine, format_seconds, format_signed_percent


def _faster(gain: float) -> str:
    return f"{gain:.1f}× faster" if gain >= 1.5 else format_signed_percent(gain - 1)


def advice_text(a: Advice) -> str:
    """One sentence (or two) for one piece of advice."""
    return _WORDS[a.kind](a)


def _within_margin(a: Advice) -> str:
    assert a.layout is not None and a.gain is not None and a.seconds is not None and a.margin is not None
    m = a.margin
    if a.tie and a.memory_bytes is not None and a.other_memory_bytes is not None:
        return (
            f"{a.layout.describe()} would be {format_seconds(a.seconds)} ({a.gain - 1:.0%}) faster per step but "
            f"needs {format_bytes(a.other_memory_bytes)} against {format_bytes(a.memory_bytes)}: a tie (under "
            f"{TIE_BAND:.0%}), which goes to the headroom"
        )
    # In the margin's own terms (Margin.within): the share of the chosen layout's step the faster
    # one saves, against the band -- "10% faster" (throughput) read as outside a ±9% band it was inside.
    saved = f"{format_seconds(a.seconds)} ({format_percent_fine(1 - 1 / a.gain)}) per step"
    why = (
        f"below the {m.floor_s * 1e3:g} ms floor"
        if a.gain - 1 > m.relative / (1 - m.relative)
        else f"within {_band_words(m)}"
        if m.from_uncertainty
        else f"within the tolerance ({format_percent_fine(m.relative)})"
    )
    if a.rung == a.chosen_rung:  # simpler on the same rung: no sequence parallelism, less recompute, ...
        return (
            f"{a.layout.describe()} would save {saved}, {why}: the simpler layout is kept "
            "(--tolerance 0 picks the fastest)"
        )
    return (
        f"{a.rung} would save {saved} ({a.layout.describe()}), {why}: {a.chosen_rung} is kept "
        "(--tolerance 0 picks the fastest)"
    )


def _band_words(m) -> str:
    """``the model's uncertainty (±9.4%)``; on an uncalibrated CPU, the calibrated band it borrows."""
    pct = format_percent_fine(m.relative)
    if m.stand_in:
        return f"the model's uncertainty after calibration (±{pct}, the CPU matrix's; this plan is uncalibrated)"
    return f"the model's uncertainty (±{pct})"


def _close_to_limit(a: Advice) -> str:
    assert a.memory_bytes is not None and a.capacity_bytes is not None
    text = (
        f"warning: memory close to the limit: {format_bytes(a.memory_bytes)} of {format_bytes(a.capacity_bytes)} "
        f"({a.memory_bytes / a.capacity_bytes:.0%}) — a longer sequence, another allocator or NCCL's buffers "
        f"may not fit"
    )
    if a.layout is not None and a.gain is not None and a.other_memory_bytes is not None:
        text += (
            f"; roomier: {a.layout.describe()} at {format_bytes(a.other_memory_bytes)}, "
            f"{format_signed_percent(a.gain - 1)} tokens/s (fix its keys to get it)"
        )
    return text


def _headroom(a: Advice) -> str:
    assert a.layout is not None and a.memory_bytes is not None and a.capacity_bytes is not None
    return (
        f"hint: {a.layout.describe()} needs {format_bytes(a.memory_bytes)}, within the device's "
        f"{format_bytes(a.capacity_bytes)} but not within the headroom the planner keeps; hardware.headroom = 0 "
        f"would accept it at {a.memory_bytes / a.capacity_bytes:.0%} of the device (no margin for what the "
        f"model leaves out)"
    )


def _batch(a: Advice) -> str:
    assert a.layout is not None and a.gain is not None and a.value is not None
    return (
        f"hint: the global batch divides badly over the devices; global_batch = {a.value} would give "
        f"{a.layout.describe()} at {_faster(a.gain)} tokens/s"
    )


def _devices(a: Advice) -> str:
    assert a.mfu is not None
    text = f"warning: MFU {a.mfu:.0%}: more devices than this model and batch can use"
    if a.value is not None and a.gain is not None and a.other_mfu is not None:
        text += (
            f"; {a.value} devices would reach {a.gain:.0%} of this throughput at MFU {a.other_mfu:.0%} "
            f"({a.layout.describe() if a.layout else ''})"
        )
    return text


def _fixed_key(a: Advice) -> str:
    assert a.layout is not None and a.gain is not None
    freed = " and ".join(k.split(" = ")[0] + " = auto" for k in a.keys)
    return f"hint: the plan fixes {' and '.join(a.keys)}; {freed}: {_faster(a.gain)} tokens/s ({a.layout.describe()})"


def _per_node_network(a: Advice) -> str:
    assert a.bandwidth is not None and a.value is not None
    return (
        f"warning: inter_node_bw = {format_bandwidth(a.bandwidth)} is per device, but it looks like a per-node "
        f"figure (more than one network port or NVLink gives); if it is the node's, write "
        f"inter_node_bw_per_node = {format_bandwidth(a.bandwidth)} (planc divides it by per_node = {a.value})"
    )


def _unchecked(a: Advice) -> str:
    assert a.regime is not None
    ranks, ratio = a.regime
    where = f"shards data parallelism over {ranks} ranks with DP traffic {ratio:.2f}× its compute"
    widest = widest_checked()
    checked = (
        f"more ranks than any published run the model was checked on (at most {widest.shard_ranks}, "
        f"at {widest.traffic_ratio:.2f}×: {widest.run}, predicted {format_signed_percent(widest.error)})"
        if widest
        else "and no published run checks the model there"
    )
    beyond = sharded_dp_beyond()
    if beyond:
        slow = sorted(1 + r.error for r in beyond)
        families = sorted({r.run.split("/")[0] for r in beyond})
        low, high = min(r.shard_ranks for r in beyond), max(r.shard_ranks for r in beyond)
        checked += (
            f"; the one published measurement at {low}–{high} ranks ({', '.join(families)}, another program)"
            f" ran {slow[0]:.1f}–{slow[-1]:.1f}× slower than this model predicts"
        )
    if a.layout is not None and a.gain is not None:
        speed = f"{_faster(a.gain)} by the model" if a.gain >= 1 else f"{1 - a.gain:.0%} slower but simpler"
        return (
            f"note: the rule would pick {a.layout.describe()} ({speed}), but it {where}, {checked}: "
            f"set aside for a checked layout (fix its keys to take it anyway)"
        )
    why = "the plan fixes it" if a.fixed else "no checked layout fits"
    return f"warning: this layout {where}, {checked}; {why}, so expect a wider error than the band"


_WORDS = {
    "unchecked": _unchecked,
    "within_margin": _within_margin,
    "close_to_limit": _close_to_limit,
    "headroom": _headroom,
    "batch": _batch,
    "devices": _devices,
    "fixed_key": _fixed_key,
    "per_node_network": _per_node_network,
}
