"""What a whole run costs, and how sure the numbers are: ``planc explain``'s training totals.

The plan's ``train.steps`` optimizer steps of ``global_batch x seq_len`` tokens each take
``steps x step time`` on ``world_size`` devices. Every predicted time carries the cost model's
uncertainty band: :func:`~planc.cost.uncertainty.step_time_uncertainty`, the typical relative
error of a predicted step time on published runs the model was not tuned on (docs/accuracy.md),
on CPU processes the CPU matrix's after calibration, and none at the ``cpu`` preset's placeholder
rates (shown as "uncalibrated").
MFU is inversely proportional to the step time, so it carries the same relative band. The band
says how far a prediction typically is from a measured run, not a bound: a run may fall outside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planc.cost.estimate import Estimate
from planc.cost.uncertainty import step_time_uncertainty
from planc.spec.plan import Plan
from planc.units import format_count, format_seconds


@dataclass(frozen=True)
class Totals:
    """The run the plan describes, under the chosen layout's estimate."""

    steps: int
    tokens: int
    """steps x global_batch x seq_len."""
    seconds: float
    """steps x predicted step time (no checkpointing, evaluation or restarts)."""
    device_hours: float
    """seconds x world_size / 3600."""
    band: float | None
    """Relative uncertainty of every predicted time (and of MFU), e.g. 0.08; None where the
    prediction has no band (CPU processes at the ``cpu`` preset's placeholder rates)."""


def training_totals(plan: Plan, est: Estimate) -> Totals:
    steps = plan.train.steps
    seconds = steps * est.step_s
    return Totals(
        steps=steps,
        tokens=steps * plan.tokens_per_step,
        seconds=seconds,
        device_hours=seconds * plan.world_size / 3600,
        band=step_time_uncertainty(plan.hardware),
    )


def format_duration(seconds: float) -> str:
    """``'42.0 s'``, ``'3.5 min'``, ``'7.2 h'``, ``'5.3 days'``: one unit a person plans in."""
    if seconds < 60:
        return format_seconds(seconds)
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return format_seconds(seconds)


def band_text(band: float | None) -> str:
    """``'±8%'``; ``'(uncalibrated)'`` without a band."""
    return "(uncalibrated)" if band is None else f"±{band:.0%}"


def mfu_text(mfu: float, band: float | None) -> str:
    """``'MFU 36% (33–39%)'``: MFU scales as 1 / step time, so a step time within ±b moves it
    between mfu / (1 + b) and mfu / (1 - b). ``'MFU 45% (uncalibrated)'`` without a band."""
    if band is None:
        return f"MFU {mfu:.0%} (uncalibrated)"
    return f"MFU {mfu:.0%} ({mfu / (1 + band):.0%}–{mfu / (1 - band):.0%})"


def totals_line(plan: Plan, est: Estimate) -> str:
    """``training 5,000 steps × 1.05 M tokens = 5.24 B tokens · 5.36 days ±8% · 1.03 k device-hours``."""
    t = training_totals(plan, est)
    return (
        f"  training  {t.steps:,} steps × {format_count(plan.tokens_per_step)} tokens = "
        f"{format_count(t.tokens)} tokens · {format_duration(t.seconds)} {band_text(t.band)} on "
        f"{plan.world_size} devices · {format_count(t.device_hours)} device-hours"
    )


def totals_dict(plan: Plan, est: Estimate) -> dict[str, Any]:
    """The ``--json`` ``training`` object (times in seconds; ``uncertainty`` relative)."""
    t = training_totals(plan, est)
    return {
        "steps": t.steps,
        "tokens": t.tokens,
        "seconds": t.seconds,
        "device_hours": t.device_hours,
        "uncertainty": t.band,
        "seconds_range": None if t.band is None else [t.seconds * (1 - t.band), t.seconds * (1 + t.band)],
    }
