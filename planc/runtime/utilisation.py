"""Measured step time and MFU beside what the planner predicted for the layout.

MFU is model FLOPs per second over the devices' dense peak (Chowdhery et al. 2022, App. B), with
exactly the numbers ``planc explain`` uses: the model FLOPs of :mod:`planc.cost.flops` (no
recomputation counted) and the peak of the plan's compute precision (:func:`planc.cost.compute.device_for`).
The predicted MFU is the same quotient at the predicted step time, so the two differ only by
the ratio of the step times.
"""

from __future__ import annotations

from typing import Any

from planc.cost.compute import device_for
from planc.cost.flops import model_flops_per_step


class Utilisation:
    """Turns a measured step time into ``mfu`` and carries the prediction's ``predicted_step_s``/``_mfu``."""

    def __init__(self, plan, predicted: dict[str, Any] | None = None):
        self.flops_per_step = model_flops_per_step(plan.model, plan.tokens_per_step)
        self.peak_total = device_for(plan.hardware, plan.train.precision).peak * plan.world_size
        self.predicted_step_s = float(predicted["step_s"]) if predicted and predicted.get("step_s") else None
        #: steps a strategy runs before it works as priced (the program's ``PREDICTED``): no prediction for them
        self.steady_after = int(predicted.get("steady_after", 0)) if predicted else 0

    def mfu(self, step_s: float) -> float | None:
        return self.flops_per_step / (step_s * self.peak_total) if step_s > 0 else None

    def fields(self, step_s: float, step: int | None = None) -> dict[str, float]:
        """The extra fields of one step's record (``step``, 1-based: before a strategy works as
        priced, the record says from which step the prediction holds instead of giving it)."""
        out: dict[str, float | None] = {"mfu": self.mfu(step_s)}
        if step is not None and step <= self.steady_after:
            out["predicted_from_step"] = self.steady_after + 1
        elif self.predicted_step_s is not None:
            out["predicted_step_s"] = self.predicted_step_s
            out["predicted_mfu"] = self.mfu(self.predicted_step_s)
        return {key: value for key, value in out.items() if value is not None}
