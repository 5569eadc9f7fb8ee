"""The training loop: steps, metrics, validation, checkpoints, stop requests, shutdown.

``train(job, steps=..., out_dir=...)`` runs optimizer steps ``start .. steps-1`` on the plan's
data (every data source maps a step to its global batch, so resuming needs only the step),
computes the validation loss every ``train.eval_every`` steps when the plan has ``val_data``,
writes ``metrics.jsonl`` (and the plan's metrics sinks) and progress lines on rank 0, saves a DCP
checkpoint every ``checkpoint.every`` steps and at the end, and resumes from the newest complete one.
Ctrl-C or SIGTERM finishes the step in flight on every rank, saves, then stops cleanly. What
surrounds the steps -- resuming, heartbeats, stop requests, checkpoints and their failures,
collective timeouts -- is :class:`planc.runtime.attempt.Attempt`. :func:`shutdown` destroys the
process group.
"""

from __future__ import annotations

import io
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

from planc.runtime.attempt import Attempt
from planc.runtime.step import rank_batch, train_step


def train(
    job,
    *,
    steps: int | None = None,
    out_dir: str | Path | None = None,
    data_dir: str | Path | None = None,
    quiet: bool = False,
    data: str | None = None,
    val_data: str | None = None,
    log: tuple[str, ...] | list[str] = (),
    predicted: dict | None = None,
) -> list[dict]:
    """Train ``job`` to ``steps`` finished optimizer steps (default: the plan's); returns this run's step records.

    ``quiet`` silences the progress lines (metrics.jsonl is still written). ``out_dir`` (the run
    directory) receives ``metrics.jsonl``, ``data.json`` and, when the plan has a checkpoint block, the
    checkpoints (``checkpoint.dir`` relative to it). ``data``/``val_data`` replace the plan's data paths,
    ``data_dir`` the directory its relative paths resolve against; ``log`` adds metrics sinks to the
    plan's; ``predicted`` (the program's ``PREDICTED``) is logged beside the measured step time.
    """
    from planc.runtime import metrics
    from planc.runtime.run_data import open_run_data
    from planc.runtime.utilisation import Utilisation

    plan = job.plan
    total = _steps_to_train(plan, steps)
    # Timeouts, heartbeats, resuming, stop requests, checkpoints and their failures: runtime/attempt.py.
    attempt = Attempt(job, out_dir=out_dir, total_steps=total)
    run_data = open_run_data(job, data=data, val_data=val_data, data_root=data_dir, out_dir=out_dir)
    start = attempt.start()
    utilisation = Utilisation(plan, predicted)

    logger = _metrics_logger(job, out_dir, total, quiet, predicted)
    sinks = _open_sinks(job, [*plan.train.log, *log], out_dir, start, predicted)
    records = []
    run_step, rows = _step_function(job, out_dir), NextRows(job, run_data.train)
    with logger, sinks, attempt.guard() as stop_requested:
        for step in range(start, total):
            attempt.before_step(step + 1)
            metrics.reset_peak_memory(job.device)  # memory_bytes: this step's peak
            began = time.perf_counter()
            # The stop vote travels with the step's loss (runtime/step.py); the next rows are built meanwhile.
            result = run_step(job, rows.take(step), stop_requested, before_sync=rows.ahead_of(step, total))
            stop, memory = result.pop("stop"), result.pop("memory_bytes")  # memory: before evaluation's peak
            if job.device.type == "cuda":
                torch.cuda.synchronize(job.device)
            elapsed = time.perf_counter() - began
            extra = _fields_after_step(job, run_data, utilisation, step + 1, total, elapsed)
            record = logger.log(
                step + 1,
                loss=result["loss"],
                lr=result["lr"],
                step_s=elapsed,
                grad_norm=result["grad_norm"],
                memory_bytes=memory,
                **extra,
            )
            if record is not None:
                sinks.log(record)
            records.append({"step": step + 1, **result, "step_s": elapsed, **extra})
            attempt.after_step(step + 1)
            if stop:
                attempt.stop(stop_requested)
                break
        else:
            attempt.finish()
    return records


def _metrics_logger(job, out_dir: str | Path | None, total: int, quiet: bool, predicted: dict | None):
    """metrics.jsonl, and rank 0's progress lines with the predicted step time's band, from the
    program's ``PREDICTED`` (its start-up line prints the same band)."""
    from planc.runtime.metrics import MetricsLogger

    return MetricsLogger(
        Path(out_dir) / "metrics.jsonl" if out_dir is not None else None,
        tokens_per_step=job.plan.tokens_per_step,
        total_steps=total,
        rank=dist.get_rank(),
        print_every=job.plan.train.log_every,
        device=job.device,
        stream=io.StringIO() if quiet else None,
        predicted=predicted,
    )


class NextRows:
    """This rank's rows of each step, the next step's built ahead: :func:`train_step` calls
    :meth:`prepare` once the step's work is queued and before it reads the step's results, so on a
    GPU the host builds the next rows while the device still computes (with synthetic data, 8 ms
    per step for Llama 3's 4 x 8,193 tokens, where the device would have waited: docs/gpu.md). A
    failure while preparing (a data file that ends) is raised when that step takes its rows, where
    building them in place would have raised it."""

    def __init__(self, job, source) -> None:
        self.job, self.source = job, source
        self._ready: tuple[int, torch.Tensor | BaseException] | None = None

    def prepare(self, step: int) -> None:
        try:
            self._ready = (step, rank_batch(self.job, self.source, step))
        except Exception as error:  # raised at take(step), in its own step
            self._ready = (step, error)

    def ahead_of(self, step: int, total: int) -> Callable[[], None] | None:
        """What builds the rows of the step after ``step`` (None after the last step)."""
        return partial(self.prepare, step + 1) if step + 1 < total else None

    def take(self, step: int) -> torch.Tensor:
        ready, self._ready = self._ready, None
        if ready is None or ready[0] != step:
            return rank_batch(self.job, self.source, step)
        if isinstance(ready[1], BaseException):
            raise ready[1]
        return ready[1]


def _step_function(job, out_dir):
    """``train_step``, or under ``planc verify`` (``PLANC_VERIFY`` set) the same steps measured
    (:class:`planc.verify.probe.StepProbe`)."""
    if not os.environ.get("PLANC_VERIFY"):
        return train_step
    from planc.verify.probe import StepProbe

    return StepProbe(job, out_dir)


def _steps_to_train(plan, steps: int | None) -> int:
    """``steps`` (default: the plan's); past a schedule decayed to 0 refused, past one holding min_lr warned."""
    from planc.spec.train import steps_beyond_schedule

    total = steps if steps is not None else plan.train.steps
    refusal, warning = steps_beyond_schedule(plan.train, total)
    if refusal:
        raise SystemExit(f"planc: {refusal}")
    if warning and dist.get_rank() == 0:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return total


def _fields_after_step(job, run_data, utilisation, done: int, total: int, step_s: float) -> dict:
    """The record's extra fields: MFU beside the prediction, and the validation loss on evaluation steps."""
    from planc.runtime.evaluate import validation_loss

    extra = utilisation.fields(step_s, done)
    train = job.plan.train
    if run_data.validation is not None and (done % train.eval_every == 0 or done == total):
        began = time.perf_counter()
        extra["val_loss"] = validation_loss(job, run_data.validation, train.eval_batches)
        extra["eval_s"] = time.perf_counter() - began
    return extra


def _open_sinks(job, names: list[str], out_dir, start: int, predicted: dict | None):
    """Rank 0's metrics sinks (TensorBoard, W&B, plugins); none elsewhere or without a run directory."""
    from planc.runtime.sinks import SinkRun, Sinks

    if dist.get_rank() != 0 or out_dir is None or not names:
        return Sinks((), None)
    out = Path(out_dir)
    config = {
        "plan": job.plan.model_dump(mode="json"),
        "layout": job.layout.model_dump(mode="json"),
        "predicted": predicted,
    }
    return Sinks(names, SinkRun(out_dir=out, name=out.resolve().name, start_step=start, config=config))


def shutdown() -> None:
    """Leave the process group (every rank calls it at the end, also after an error)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def leave() -> NoReturn:
    """End a process whose training finished, without interpreter finalization.

    About one launch in 30 aborted *after* everything had finished ("terminate called without an
    active exception", status -6: a C++ thread of torch destroyed while joinable during static
    destruction), which torchrun then reports as a failed worker and restarts. Everything planc
    opened is closed by then -- metrics file, sinks, checkpoint writes, process group -- so the
    process leaves with status 0 directly (tests/ranks.py and planc/runtime/torchrun.py do the same).
    A failure raises before this is reached and exits as Python does."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
