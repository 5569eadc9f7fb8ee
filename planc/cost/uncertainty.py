"""How far the cost model's step times are from published runs: the planner's uncertainty band.

``accuracy.json`` next to this module is written by ``python bench/accuracy.py --write-stats``
from ``tests/data/published_runs.json`` (a test checks it is current); docs/accuracy.md lists
its fields. The error of a run is predicted throughput / reported throughput - 1. Families are
``tune`` (what the model was built on) or ``test`` (held out); the band is taken from the
held-out families only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from planc.spec.hardware import HardwareSpec

ACCURACY_FILE = Path(__file__).with_name("accuracy.json")


@lru_cache(maxsize=1)
def accuracy_table() -> dict:
    """The whole file: ``band`` and per-family statistics under ``families``."""
    return json.loads(ACCURACY_FILE.read_text(encoding="utf-8"))


#: The step-time error on CPU processes priced with a calibration of the machine (``planc calibrate
#: --cpu``): the CPU equivalence matrix's median |error| after calibration, the median over ten
#: two-process runs of 2026-11-29 (12-18.5 %; load 0.7-4.5), after the step's own all-reduces (gradient
#: norm, tied embeddings) and the broadcast's own fit were priced (docs/accuracy.md, "The CPU
#: matrix"; the 4-process matrix read 19 % that day; the band had been 24 %, six runs of 2026-11-27
#: at load 1.6-3). The published-run band is a GPU figure; a CPU step is host work that varies far
#: more (the measured side alone by a median 16 % between two runs).
CPU_CALIBRATED_RELATIVE = 0.15


def step_time_uncertainty(hardware: HardwareSpec | None = None) -> float | None:
    """Typical relative error of a predicted step time on a program the model was not tuned on.

    GPUs (and no ``hardware``): the median, over the held-out published families in the goal, of
    each family's median |error|. CPU processes priced with a hardware profile: the CPU matrix's
    calibrated error, :data:`CPU_CALIBRATED_RELATIVE`. CPU processes priced with the ``cpu``
    preset's placeholder rates: None, no band (the matrix measured steps 2x to 100x those
    predictions: an order of magnitude, not a band)."""
    if hardware is not None and hardware.is_cpu:
        return CPU_CALIBRATED_RELATIVE if hardware.measured is not None else None
    return float(accuracy_table()["band"]["step_time_relative"])


def uncertainty_basis(hardware: HardwareSpec | None = None) -> str:
    """Where :func:`step_time_uncertainty` comes from, in words."""
    if hardware is not None and hardware.is_cpu:
        if hardware.measured is not None:
            return "the CPU matrix after calibration (docs/accuracy.md)"
        return (
            f"none: the {hardware.device!r} preset's rates are placeholders, not this machine; "
            "`planc calibrate --cpu` measures it (docs/calibrate.md)"
        )
    return "published runs the model was not tuned on (docs/accuracy.md)"


def planning_uncertainty(hardware: HardwareSpec | None = None) -> float:
    """The band the planner's margin uses: :func:`step_time_uncertainty`, and on an uncalibrated
    CPU the calibrated CPU band (the model cannot resolve layouts there any better)."""
    band = step_time_uncertainty(hardware)
    return CPU_CALIBRATED_RELATIVE if band is None else band


def planning_uncertainty_basis(hardware: HardwareSpec | None = None) -> str:
    """Where :func:`planning_uncertainty` comes from, in words: :func:`uncertainty_basis`, except on
    an uncalibrated CPU, whose own prediction has no band and whose margin is the calibrated one."""
    if step_time_uncertainty(hardware) is None:
        return "the CPU matrix after calibration (docs/accuracy.md); this plan is uncalibrated"
    return uncertainty_basis(hardware)


# -- where the model has been checked: sharded data parallelism at scale --------------------------
#
# Sharded data parallelism (ZeRO-2/3, FSDP, HSDP) moves a per-rank volume that does not shrink with
# the number of ranks, and hides it behind compute. The published runs check that model up to some
# number of ranks; beyond, the one published measurement (Narayanan et al. 2021 Table 2:
# DeepSpeed's ZeRO-3 of 2021 at 384-1536 ranks) ran 1.4-3.6x slower than predicted, for reasons
# docs/accuracy.md narrows to that program but cannot prove. So a layout sharding over more ranks
# than every checked run is flagged, and the planner prefers a checked one when one fits
# (docs/planner.md, "How sure").


@dataclass(frozen=True)
class CheckedRun:
    """A published run of sharded data parallelism, as the cost model saw it."""

    run: str
    shard_ranks: int
    """Ranks the model states are sharded over (the dp group, or HSDP's shard group)."""
    traffic_ratio: float
    """The model's data-parallel communication time over compute time for the run."""
    error: float
    """predicted throughput / reported throughput - 1."""


@lru_cache(maxsize=2)
def _runs(key: str) -> tuple[CheckedRun, ...]:
    block = accuracy_table().get("sharded_dp", {})
    return tuple(CheckedRun(**r) for r in block.get(key, ()))


def sharded_dp_frontier() -> tuple[CheckedRun, ...]:
    """The checked runs (held-out families in the goal, predicted within :func:`sharded_dp_within`)
    that no other checked run exceeds in both shard ranks and traffic ratio."""
    return _runs("frontier")


def sharded_dp_beyond() -> tuple[CheckedRun, ...]:
    """Published sharded runs outside the goal (programs planc does not model), with their errors."""
    return _runs("beyond")


def sharded_dp_within() -> float:
    """The |error| a published run had to be predicted within to count as checked."""
    return float(accuracy_table().get("sharded_dp", {}).get("within", 0.15))


def sharded_dp_checked_by(shard_ranks: int) -> CheckedRun | None:
    """The checked run with the fewest shard ranks that are still at least ``shard_ranks``, or None
    when every checked run sharded over fewer ranks.

    Ranks, not the traffic ratio, decide: what the published runs leave open is the scale (the
    regime of issue 12 point 4), while a high ratio of data-parallel traffic to compute on a slow
    network is as unchecked for DDP as for ZeRO-3, and setting aside only the sharded layouts
    there would trade a slow network's HSDP for a slower ZeRO-1."""
    covering = [r for r in sharded_dp_frontier() if r.shard_ranks >= shard_ranks]
    return min(covering, key=lambda r: r.shard_ranks) if covering else None
