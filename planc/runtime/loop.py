"""The training loop: steps, metrics, checkpoints, Ctrl-C, shutdown.

``train(job, steps=..., out_dir=...)`` runs optimizer steps ``start .. steps-1`` on the plan's
data (every data source maps a step to its global batch, so resuming needs only the step),
writes ``metrics.jsonl`` and progress lines on rank 0, saves a DCP checkpoint every
``checkpoint.every`` steps and resumes from the newest complete one. Ctrl-C (SIGINT, or the
SIGTERM torchrun forwards) finishes the step in flight on every rank, then stops cleanly;
:func:`shutdown` destroys the process group.
"""

from __future__ import annotations

import io
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from planc.runtime.data import build_data
from planc.runtime.local_shards import dtensor_parameters
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
    checkpoint_dir = None
    if plan.checkpoint is not None and out_dir is not None:
        checkpoint_dir = Path(out_dir) / plan.checkpoint.dir
    start = 0
    if checkpoint_dir is not None:
        from planc.runtime.checkpoint import load_checkpoint, save_checkpoint
    if checkpoint_dir is not None and plan.checkpoint.resume and checkpoint_dir.is_dir():
        with dtensor_parameters(job):
            resumed = load_checkpoint(checkpoint_dir, job.model_parts, job.optimizers, job.lr_schedulers)
        start = resumed["step"] if resumed else 0

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
    step = start
    with logger, _stop_on_interrupt() as interrupted, _explained_failures(job, lambda: step + 1):
        for step in range(start, total):
            began = time.perf_counter()
            result = train_step(job, data.batch_for_step(step))
            if job.device.type == "cuda":
                torch.cuda.synchronize(job.device)
            elapsed = time.perf_counter() - began
            logger.log(step + 1, loss=result["loss"], lr=result["lr"], step_s=elapsed, grad_norm=result["grad_norm"])
            records.append({"step": step + 1, **result, "step_s": elapsed})
            if checkpoint_dir is not None and (step + 1) % plan.checkpoint.every == 0:
                with dtensor_parameters(job):
                    save_checkpoint(
                        checkpoint_dir,
                        step + 1,
                        job.model_parts,
                        job.optimizers,
                        job.lr_schedulers,
                        keep=plan.checkpoint.keep,
                    )
            if _agreed(interrupted(), job):
                saving = checkpoint_dir is not None and (step + 1) % plan.checkpoint.every != 0
                if dist.get_rank() == 0:
                    print(
                        f"interrupted after step {step + 1}; "
                        + ("saving a checkpoint, then " if saving else "")
                        + "stopping",
                        flush=True,
                    )
                if saving and checkpoint_dir is not None:  # so that running again resumes exactly here
                    with dtensor_parameters(job):
                        save_checkpoint(
                            checkpoint_dir,
                            step + 1,
                            job.model_parts,
                            job.optimizers,
                            job.lr_schedulers,
                            keep=plan.checkpoint.keep,
                        )
                break
    return records


@contextmanager
def _explained_failures(job, current_step) -> Iterator[None]:
    """A lost peer or an out-of-memory error ends this rank with one explaining line (exit 1)
    instead of a traceback; other errors propagate unchanged."""
    from planc.runtime.failures import describe_failure

    try:
        yield
    except Exception as exc:
        message = describe_failure(exc, rank=dist.get_rank(), step=current_step())
        if message is None:
            raise
        print(message, file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _agreed(flag: bool, job) -> bool:
    """True when any rank saw Ctrl-C (every rank must leave the loop at the same step)."""
    value = torch.tensor([1.0 if flag else 0.0], device=job.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


@contextmanager
def _stop_on_interrupt() -> Iterator:
    """Turn the first SIGINT or SIGTERM into a flag checked between steps; a second one interrupts at once.

    Ctrl-C reaches every process of the terminal's process group, torchrun included, which then
    sends its workers SIGTERM and waits for them: both signals finish the step in flight, save
    nothing half-written and leave the loop on every rank at the same step (see ``_agreed``).
    """
    state = {"hit": False}
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def handler(signum, frame):
        if state["hit"]:
            for sig in signals:
                signal.signal(sig, previous[sig])
            raise KeyboardInterrupt
        state["hit"] = True

    try:
        for sig in signals:
            signal.signal(sig, handler)
    except ValueError:  # not the main thread: leave the signals alone
        yield lambda: False
        return
    try:
        yield lambda: state["hit"]
    finally:
        for sig in signals:
            signal.signal(sig, previous[sig])


def shutdown() -> None:
    """Leave the process group (every rank calls it at the end, also after an error)."""
    if dist.is_initialized():
        dist.destroy_process_group()
