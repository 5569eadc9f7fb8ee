"""The training loop: steps, metrics, checkpoints, Ctrl-C, shutdown.

``train(job, steps=..., out_dir=...)`` runs optimizer steps ``start .. steps-1`` on the plan's
data (every data source maps a step to its global batch, so resuming needs only the step),
writes ``metrics.jsonl`` and progress lines on rank 0, saves a DCP checkpoint every
``checkpoint.every`` steps and at the end, and resumes from the newest complete one. Ctrl-C or
SIGTERM finishes the step in flight on every rank, saves, then stops cleanly. What surrounds the
steps -- resuming, heartbeats, stop requests, checkpoints and their failures, collective timeouts
-- is :class:`planc.runtime.attempt.Attempt`. :func:`shutdown` destroys the process group.
"""

from __future__ import annotations

import io
import time
from pathlib import Path

import torch
import torch.distributed as dist

from planc.runtime.attempt import Attempt
from planc.runtime.data import build_data
from planc.runtime.step import train_step


def train(
    job,
    *,
    steps: int | None = None,
    out_dir: str | Path | None = None,
    data_dir: str | Path | None = None,
    quiet: bool = False,
) -> list[dict]:
    """Train ``job`` to ``steps`` finished optimizer steps (default: the plan's); returns this run's step records.

    ``quiet`` silences the progress lines (metrics.jsonl is still written). ``out_dir`` (the run
    directory) receives ``metrics.jsonl`` and, when the plan has a checkpoint block, the checkpoints
    (``checkpoint.dir`` relative to it).
    """
    from planc.runtime.metrics import MetricsLogger

    plan = job.plan
    total = steps if steps is not None else plan.train.steps
    data = build_data(plan.train, plan.model, base_dir=data_dir)
    # Timeouts, heartbeats, resuming, stop requests, checkpoints and their failures: runtime/attempt.py.
    attempt = Attempt(job, out_dir=out_dir, total_steps=total)
    start = attempt.start()

    logger = MetricsLogger(
        Path(out_dir) / "metrics.jsonl" if out_dir is not None else None,
        tokens_per_step=plan.tokens_per_step,
        total_steps=total,
        rank=dist.get_rank(),
        print_every=plan.train.log_every,
        device=job.device,
        stream=io.StringIO() if quiet else None,
    )
    records = []
    with logger, attempt.guard() as stop_requested:
        for step in range(start, total):
            attempt.before_step(step + 1)
            began = time.perf_counter()
            result = train_step(job, data.batch_for_step(step))
            if job.device.type == "cuda":
                torch.cuda.synchronize(job.device)
            elapsed = time.perf_counter() - began
            logger.log(step + 1, loss=result["loss"], lr=result["lr"], step_s=elapsed, grad_norm=result["grad_norm"])
            records.append({"step": step + 1, **result, "step_s": elapsed})
            attempt.after_step(step + 1)
            if _agreed(bool(stop_requested), job):
                attempt.stop(stop_requested)
                break
        else:
            attempt.finish()
    return records


def _agreed(flag: bool, job) -> bool:
    """True when any rank was asked to stop (every rank must leave the loop at the same step)."""
    value = torch.tensor([1.0 if flag else 0.0], device=job.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def shutdown() -> None:
    """Leave the process group (every rank calls it at the end, also after an error)."""
    if dist.is_initialized():
        dist.destroy_process_group()
