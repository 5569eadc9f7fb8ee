"""What a faster layout must buy to be worth a more complex one: the planner's margin, in one place.

The cost model cannot tell apart two step times closer than its own error. So climbing a rung
(or picking a larger micro-batch that needs more memory) must buy more than

- the model's **measured uncertainty**: the typical relative error of a predicted step time on
  programs it was not tuned on (:func:`planc.cost.uncertainty.planning_uncertainty`: on GPUs the
  published-run accuracy table's, on CPU processes the CPU matrix's; docs/accuracy.md), and
- an **absolute floor** of :data:`FLOOR_S` per step: a difference smaller than that is below
  what one step's unmodelled host work varies by (see the constant).

A plan's ``layout.tolerance`` (or ``--tolerance``) replaces the relative band and drops the floor:
a number the user writes is taken literally (``--tolerance 0`` picks the fastest layout).

Among layouts of equal complexity, speed differences below :data:`TIE_BAND` are a tie, and a tie
goes to the layout that leaves the most memory free when that is worth having (at least
:data:`MEMORY_WORTH` of the capacity); otherwise to the faster (docs/planner.md, "Headroom").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from planc.cost.uncertainty import planning_uncertainty, planning_uncertainty_basis, step_time_uncertainty
from planc.units import format_percent_fine

if TYPE_CHECKING:
    from planc.spec.hardware import HardwareSpec

#: Seconds per step a more complex layout must save, whatever the model's relative band says.
#: A training step also runs host work planc does not model: the Python loop, the optimizer's
#: kernel launches (PyTorch's eager launch overhead is ~5-10 us per kernel: "Accelerating PyTorch
#: with CUDA Graphs", PyTorch blog 2021; a GPT-2 step launches a few thousand), the data loader's
#: hand-off and, on CPU processes, the OS scheduler's time slices (1-4 ms, Linux CFS). A few
#: milliseconds per step is where a predicted difference stops meaning anything.
FLOOR_S = 0.005

#: Layouts of equal complexity whose speeds differ by less than this are tied (the same program
#: at two micro-batches: their errors are correlated, so the band is narrower than across
#: strategies); a tie goes to the one with the least memory.
TIE_BAND = 0.02

#: A tie goes to the roomier layout only when it frees at least this fraction of the capacity (8 GiB
#: of an 80 GB part): a few MiB saved on a tiny model is no reason to take a slower micro-batch.
MEMORY_WORTH = 0.1


@dataclass(frozen=True)
class Margin:
    """How much faster a more complex layout must be to be chosen."""

    relative: float
    """Fraction of the step time (the tolerance)."""
    floor_s: float
    """Seconds per step."""
    from_uncertainty: bool
    """True when ``relative`` is the model's measured uncertainty (no tolerance was given)."""
    stand_in: bool = False
    """True when that uncertainty is not the plan's own: CPU processes at the ``cpu`` preset's
    placeholder rates have none, and take the CPU matrix's after calibration."""
    source: str = "tolerance"
    """Where ``relative`` comes from, in words (:func:`planc.cost.uncertainty.planning_uncertainty_basis`)."""

    def within(self, step_s: float, best_step_s: float) -> bool:
        """Whether a layout stepping in ``step_s`` is as good as the best (``best_step_s``) within
        the model's resolution: the best's gain is below the band or below the floor."""
        gain = step_s - best_step_s
        return best_step_s / step_s >= 1.0 - self.relative or gain <= self.floor_s

    def describe(self) -> str:
        """``±9.4% or 5 ms per step (the model's measured uncertainty)`` / ``5% (tolerance)``; on an
        uncalibrated CPU, whose band it is: ``... (the CPU matrix's measured uncertainty after
        calibration; this plan is uncalibrated)``."""
        pct = format_percent_fine(self.relative)
        if self.from_uncertainty:
            return f"±{pct} or {self.floor_s * 1e3:g} ms per step ({self.uncertainty_words()})"
        return f"{pct} (tolerance)"

    def uncertainty_words(self) -> str:
        """The band's name: the model's measured uncertainty, or the calibrated one standing in."""
        if self.stand_in:
            return "the CPU matrix's measured uncertainty after calibration; this plan is uncalibrated"
        return "the model's measured uncertainty"


def planner_margin(tolerance: float | str | None, hardware: HardwareSpec | None = None) -> Margin:
    """The margin for a given tolerance: ``None`` or ``"auto"`` is the model's uncertainty on the
    plan's ``hardware`` (GPUs: the published runs'; CPU processes: the CPU matrix's) and the floor;
    a number is taken literally, without the floor."""
    if tolerance is None or tolerance == "auto":
        stand_in = step_time_uncertainty(hardware) is None
        return Margin(planning_uncertainty(hardware), FLOOR_S, True, stand_in, planning_uncertainty_basis(hardware))
    return Margin(float(tolerance), 0.0, False)
