"""What carries over when a run continues from a checkpoint under another plan or layout.

A checkpoint holds the model weights and the optimizer state (moments, step counts) by parameter
name, so DCP reshards it onto any layout and device count. What must match, or planc refuses:

* the model (every key of the ``model`` block but its name): another shape has other tensors;
* the optimizer (``train.optimizer``): another optimizer keeps other state.

Everything else comes from the plan being run: the learning-rate schedule is evaluated at the
checkpoint's step, the data of step k is this plan's batch k (the data position is the step), and
the other hyperparameters (betas, weight decay, clipping) are this plan's. Differences are listed
as notes so a person sees what changes. ``resume.json`` in the new run directory records the
checkpoint it started from; the workers load it when the run has no checkpoint of its own yet.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RESUME_FILE = "resume.json"
#: train keys that change the trajectory when they differ (a note each); the optimizer is refused.
_TRAIN_NOTES = (
    "global_batch",
    "precision",
    "lr",
    "min_lr",
    "warmup_steps",
    "steps",
    "weight_decay",
    "beta1",
    "beta2",
    "grad_clip",
    "data",
    "seed",
)


def compare_plans(saved: dict[str, Any], planned: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(refusals, notes)`` for continuing a checkpoint written under plan ``saved`` (plan JSON) with ``planned``."""
    from planc.spec import ModelSpec

    refusals, notes = [], []
    old_model, new_model = saved.get("model", {}), planned.get("model", {})
    for key in ModelSpec.model_fields:  # the keys a plan sets; derived counts follow from them
        if key != "name" and old_model.get(key) != new_model.get(key):
            refusals.append(f"model.{key} is {old_model.get(key)!r} in the checkpoint, {new_model.get(key)!r} here")
    old_train, new_train = saved.get("train", {}), planned.get("train", {})
    if old_train.get("optimizer") != new_train.get("optimizer"):
        refusals.append(
            f"train.optimizer is {old_train.get('optimizer')!r} in the checkpoint, {new_train.get('optimizer')!r} "
            "here (another optimizer keeps other state)"
        )
    for key in _TRAIN_NOTES:
        if old_train.get(key) != new_train.get(key):
            notes.append(f"train.{key}: {old_train.get(key)!r} → {new_train.get(key)!r}")
    return refusals, notes


def write_resume_source(run_dir: str | Path, *, checkpoint: Path, step: int, from_run: Path) -> None:
    record = {"checkpoint": str(Path(checkpoint).resolve()), "step": step, "from_run": str(Path(from_run).resolve())}
    path = Path(run_dir) / RESUME_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_resume_source(run_dir: str | Path | None) -> dict[str, Any] | None:
    """``resume.json`` of a run directory: ``{"checkpoint", "step", "from_run"}``, or None."""
    if run_dir is None:
        return None
    try:
        data = json.loads((Path(run_dir) / RESUME_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("checkpoint"), str) else None
