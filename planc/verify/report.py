"""Predicted beside measured: the comparison rows of ``planc verify`` and their text.

Pure (no torch). One :class:`Row` per quantity and rank; ``error`` is ``predicted / measured - 1``
(positive: the cost model predicts more than the program used), None where either side is
missing or the measured value is 0.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from planc.units import format_bytes, format_seconds
from planc.verify.predicted import PEAK_NET_WORDS

if TYPE_CHECKING:
    from planc.spec.hardware import HardwareSpec

#: Goals from issue 13 (the benchmark prints them beside the errors; tests hold looser bounds).
GOALS = {"model states": 0.01, "saved activations": 0.10, "communication": 0.02}


@dataclass(frozen=True)
class Row:
    rank: int
    section: str
    """"model states", "saved activations", "communication", "peak memory" or "step time"."""
    name: str
    predicted: float | None
    measured: float | None
    unit: str = "B"
    note: str = ""

    @property
    def error(self) -> float | None:
        if self.predicted is None or not self.measured:
            return None
        return self.predicted / self.measured - 1

    def as_dict(self) -> dict:
        return {**asdict(self), "error": self.error}


def rows_for_rank(measured: dict, predicted: dict) -> list[Row]:
    """Every comparison for one rank's ``verify/rank<R>.json`` record and its prediction."""
    rank = measured["rank"]
    # The stored parameters are named for what they are (the fp32 master copy under bf16), as explain names them.
    names = {"params": predicted.get("params_name", "params")}
    rows = [
        Row(rank, "model states", names.get(key, key), predicted["model_states"][key], measured["model_states"][key])
        for key in ("params", "grads", "optimizer")
    ]
    act = measured.get("activations")
    if act:
        rows.append(
            Row(
                rank,
                "saved activations",
                "per block",
                predicted["activations"]["per_block_bytes"],
                act["per_block_bytes"],
            )
        )
        rows.append(
            Row(
                rank,
                "saved activations",
                f"{act['blocks']} block(s), 1 micro-batch",
                predicted["activations"]["blocks_bytes"],
                act["blocks_bytes"],
            )
        )
        rows.append(
            Row(rank, "saved activations", "embedding, final norm, head", None, act["outside_bytes"], note="not a term")
        )
    elif act is None and "comm" in measured:
        rows.append(Row(rank, "saved activations", "per block", None, None, note="not measurable under recompute"))
    rows.extend(_comm_rows(rank, measured.get("comm", []), predicted["comm"]))
    peak = measured.get("peak")
    if peak and peak.get("source") == "cuda" and "peak_net_bytes" in predicted:
        rows.extend(_cuda_peak_rows(rank, peak, predicted))
    elif peak:  # MemTracker counts tensors, as max_memory_allocated does: the prediction net of the margin
        net = predicted.get("peak_net_bytes", predicted["peak_bytes"])
        rows.append(Row(rank, "peak memory", "step peak", net, peak["bytes"], note=_net_note(peak)))
    if measured.get("step_s"):
        times = measured["step_s"]
        rows.append(
            Row(
                rank,
                "step time",
                "median step",
                predicted["step_s"],
                statistics.median(times),
                unit="s",
                note=_spread(times),
            )
        )
    if measured.get("timeline") and "step_parts" in predicted:
        rows.extend(_timeline_rows(rank, measured["timeline"], predicted["step_parts"]))
    return rows


def _spread(times: list[float]) -> str:
    """The timed steps' range, so that a prediction's error can be read against the measurement's
    own scatter (on a shared CPU the same step moves by tens of percent, docs/accuracy.md)."""
    if len(times) < 2:
        return "1 timed step"
    return f"{len(times)} timed steps: {format_seconds(min(times))} to {format_seconds(max(times))}"


def step_time_basis(hardware: HardwareSpec) -> str | None:
    """What a verify result's predicted step time rests on, when it is not a measurement of this
    machine: the device preset's data sheet. None when the plan prices with a hardware profile."""
    if hardware.profile:
        return None
    return (
        f"the predicted step time uses the {hardware.device!r} data sheet, not this machine: "
        "`planc calibrate` measures it (add --cpu for CPU processes) and a plan that names the result "
        '(hardware { profile = "FILE" }) is priced with it (docs/calibrate.md)'
    )


def _timeline_rows(rank: int, timeline: dict, parts: dict[str, float]) -> list[Row]:
    """The profiled step (CUDA) beside the model's parts: computing kernels against every part that
    is not a bubble or exposed communication, exposed collectives against the groups' exposed time,
    idle device time against the bubble (the model has no other idle time)."""
    exposed = sum(v for k, v in parts.items() if k.endswith(" exposed"))
    bubble = parts.get("bubble", 0.0)
    computing = sum(parts.values()) - exposed - bubble
    note = "profiled step"
    return [
        Row(rank, "step time", "compute kernels", computing, timeline["compute_s"], unit="s", note=note),
        Row(
            rank,
            "step time",
            "communication exposed",
            exposed,
            timeline["communication_exposed_s"],
            unit="s",
            note=note,
        ),
        _idle_row(rank, timeline, bubble, note),
    ]


def _idle_row(rank: int, timeline: dict, bubble: float, note: str) -> Row:
    """Idle device time against the pipeline's bubble. Without a bubble the model predicts none, and
    a relative error against a few host-bound milliseconds (-100%) would say nothing: the row then
    has no prediction and says what share of the profiled step the device waited."""
    idle = timeline["idle_s"]
    if bubble > 0:
        return Row(rank, "step time", "device idle", bubble, idle, unit="s", note=note + " (bubble; host)")
    wall = timeline.get("wall_s") or 0.0
    share = f", {idle / wall:.1%} of the step" if wall > 0 else ""
    return Row(
        rank, "step time", "device idle", None, idle, unit="s", note=f"{note}: waiting on the host{share}; not modelled"
    )


def _cuda_peak_rows(rank: int, peak: dict, predicted: dict) -> list[Row]:
    """On CUDA, like with like: the tensors (``max_memory_allocated``) against the prediction net of
    the CUDA context and the allocator margin, and the allocator's cache (``max_memory_reserved``)
    against the prediction less the context alone -- what the margin is for."""
    rows = [
        Row(rank, "peak memory", "allocated", predicted["peak_net_bytes"], peak["bytes"], note=_net_note(peak)),
    ]
    if peak.get("reserved_bytes"):
        reserved = predicted["peak_bytes"] - predicted.get("context_bytes", 0.0)
        note = "cuda max_memory_reserved; predicted: net of the CUDA context"
        rows.append(Row(rank, "peak memory", "reserved", reserved, peak["reserved_bytes"], note=note))
    return rows


def _source(peak: dict) -> str:
    return "cuda max_memory_allocated" if peak.get("source") == "cuda" else "MemTracker"


def _net_note(peak: dict) -> str:
    """The measurement's source and what the prediction beside it is: not explain's total, which
    holds the allocator margin and the CUDA context."""
    return f"{_source(peak)}; predicted: {PEAK_NET_WORDS}"


def _comm_rows(rank: int, comm: list[dict], predicted: dict[str, float]) -> list[Row]:
    by_group: dict[str, float] = {}
    kinds: dict[str, list[str]] = {}
    for entry in comm:
        group = entry["group"]
        by_group[group] = by_group.get(group, 0.0) + entry["bytes"]
        kinds.setdefault(group, []).append(f"{entry['calls']} {entry['kind']}")
    rows = []
    for group in sorted(set(by_group) | set(predicted)):
        rows.append(
            Row(
                rank,
                "communication",
                group,
                predicted.get(group),
                by_group.get(group),
                note=", ".join(kinds.get(group, [])),
            )
        )
    return rows


def value_text(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.1f} ms" if unit == "s" else format_bytes(value)


def format_rows(rows: list[Row]) -> str:
    """The table ``planc verify`` prints: one block per rank."""
    lines = []
    header = f"  {'':<20} {'':<28} {'predicted':>12} {'measured':>12} {'error':>8}  note"
    current = None
    for row in rows:
        if row.rank != current:
            current = row.rank
            lines.extend(["", f"rank {row.rank}", header])
        error = f"{row.error:+.1%}" if row.error is not None else "-"
        lines.append(
            f"  {row.section:<20} {row.name:<28} {value_text(row.predicted, row.unit):>12} "
            f"{value_text(row.measured, row.unit):>12} {error:>8}  {row.note}"
        )
    return "\n".join(lines).lstrip("\n")


def worst_errors(rows: list[Row]) -> dict[str, float]:
    """The largest |error| of each section over all ranks (what the benchmark tabulates)."""
    worst: dict[str, float] = {}
    for row in rows:
        if row.error is None:
            continue
        key = row.section
        worst[key] = max(worst.get(key, 0.0), abs(row.error))
    return worst
