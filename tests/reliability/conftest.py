"""Helpers for the reliability tests: tiny plans as .plan text, `planc run` in a subprocess, run directories read back.

Every multi-process test here compares the losses of an interrupted, restarted or re-laid-out run
with :func:`planc.runtime.reference.train_reference`, the single-process trainer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from planc.dsl.load import load_plan
from planc.rundir.metrics_file import read_metrics
from planc.runtime.reference import train_reference
from planc.strategies.registry import load_registry

FP32_TOLERANCE = 1e-5  # fp32, reductions in another order (the equivalence bound of every layout)


def write_plan(
    path: Path,
    *,
    per_node: int,
    layout: str,
    steps: int,
    micro_batch: int = 2,
    timeout: str | None = None,
    checkpoint: str | None = None,
) -> Path:
    """A tiny GPT (34 k parameters) on ``per_node`` CPU processes; ``layout`` and ``checkpoint`` are block bodies."""
    path.write_text(
        f"""model "tiny" {{
  layers = 2
  hidden = 32
  heads = 4
  vocab = 64
  seq_len = 16
}}
hardware {{
  device = "cpu"
  per_node = {per_node}
}}
train {{
  global_batch = 8
  micro_batch = {micro_batch}
  precision = fp32
  lr = 1e-2
  warmup_steps = 1
  steps = {steps}
  seed = 7
  {f"timeout = {timeout}" if timeout else ""}
}}
layout {{
  {layout}
  recompute = none
}}
{f"checkpoint {{ {checkpoint} }}" if checkpoint else ""}
"""
    )
    return path


def env(**extra: str) -> dict[str, str]:
    values = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    values.pop("PLANC_FAULT", None)
    values.update(extra)
    return values


def planc_run(plan: Path, out: Path, *args: str, timeout: float = 240, **extra_env: str):
    return subprocess.run(
        [sys.executable, "-m", "planc", "run", str(plan), "--out", str(out), *args],
        env=env(**extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir)}


def reference(plan: Path, steps: int) -> dict[int, float]:
    """The single-process losses of ``plan``, by 1-based step."""
    run = train_reference(load_plan(plan, strategies=load_registry()), steps=steps)
    return {step + 1: loss for step, loss in enumerate(run.losses)}


def assert_matches_reference(got: dict[int, float], expected: dict[int, float]) -> None:
    assert got, "no step was logged"
    differences = {step: abs(loss - expected[step]) for step, loss in got.items()}
    assert max(differences.values()) <= FP32_TOLERANCE, f"|loss - reference| by step: {differences}"


def processes_in(directory: Path) -> list[int]:
    """PIDs whose working directory is ``directory`` (torchrun and its ranks run in the run directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if Path(os.readlink(proc / "cwd")) == directory.resolve():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found
