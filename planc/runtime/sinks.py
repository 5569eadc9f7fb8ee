"""Metrics sinks: where each step's record goes besides ``metrics.jsonl`` (TensorBoard, W&B, plugins).

A plan names its sinks (``train { log = [tensorboard, wandb] }``) and ``planc run --log NAME`` adds
more. Rank 0 opens them after the data and before the first step, hands each finished step's
record (the dict ``metrics.jsonl`` gets) to every sink, and closes them at the end.

A sink plugin is registered like a strategy, under the entry-point group ``planc.metrics_sinks``::

    [project.entry-points."planc.metrics_sinks"]
    mlflow = "planc_mlflow:MlflowSink"

The object named is a factory ``factory(run: SinkRun) -> sink`` whose result has
``log(record: dict) -> None`` and ``close() -> None``. Built-ins come first: a plugin registering a
built-in's name is reported and skipped. A sink that cannot be loaded, cannot start or fails while
logging is reported on stderr and dropped -- training goes on, ``metrics.jsonl`` keeps every step.

This module imports no torch at import time: ``planc check`` reads :func:`known_sink_names`.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, TextIO

ENTRY_POINT_GROUP = "planc.metrics_sinks"


class MetricsSink(Protocol):
    def log(self, record: dict[str, Any]) -> None:
        """Take one finished step's record (``step``, ``loss``, ``lr``, ..., ``val_loss`` when evaluated)."""
        ...

    def close(self) -> None:
        """Flush and release everything (called once, also after an error)."""
        ...


@dataclass(frozen=True)
class SinkRun:
    """What a sink knows about the run it logs."""

    out_dir: Path
    """The run directory (sinks write their files under it)."""
    name: str
    """A human name for the run: the run directory's name."""
    start_step: int
    """Finished steps before this launch (0, or the step resumed from)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The plan, layout and prediction as JSON data (what W&B shows as the run's config)."""


class SinkUnavailable(RuntimeError):
    """A sink's package is not installed (the message names the extra to install)."""


#: Record field -> TensorBoard tag; other numeric fields are logged under their own name.
TENSORBOARD_TAGS = {
    "loss": "train/loss",
    "val_loss": "val/loss",
    "lr": "train/lr",
    "grad_norm": "train/grad_norm",
    "tokens_per_s": "perf/tokens_per_s",
    "step_s": "perf/step_s",
    "predicted_step_s": "perf/predicted_step_s",
    "mfu": "perf/mfu",
    "predicted_mfu": "perf/predicted_mfu",
    "memory_bytes": "memory/peak_bytes",
}


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    """The record's numeric fields (booleans and the text "nan"/"inf" left out), without ``step``."""
    return {
        key: value
        for key, value in record.items()
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
    }


class TensorBoardSink:
    """Scalars in ``RUN_DIR/tensorboard`` through ``torch.utils.tensorboard.SummaryWriter``."""

    def __init__(self, run: SinkRun):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise SinkUnavailable(f"{exc}; install it with: pip install 'planc[tensorboard]'") from None
        # purge_step: after a resume, drop the events a crashed launch wrote past the checkpoint.
        self.writer = SummaryWriter(
            log_dir=str(run.out_dir / "tensorboard"), purge_step=run.start_step + 1 if run.start_step else None
        )

    def log(self, record: dict[str, Any]) -> None:
        for key, value in _numbers(record).items():
            self.writer.add_scalar(TENSORBOARD_TAGS.get(key, key), value, record["step"])

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A Weights & Biases run in ``RUN_DIR/wandb``; ``WANDB_MODE=offline`` works without a network.

    The project is ``$WANDB_PROJECT`` (default ``planc``); the run id is derived from the run
    directory, so a resumed run continues the same W&B run.
    """

    def __init__(self, run: SinkRun):
        try:
            import wandb
        except ImportError as exc:
            raise SinkUnavailable(f"{exc}; install it with: pip install 'planc[wandb]'") from None
        run_id = hashlib.sha256(str(run.out_dir.resolve()).encode()).hexdigest()[:16]
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "planc",
            name=run.name,
            id=run_id,
            resume="allow",
            dir=str(run.out_dir),
            config=run.config,
        )

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(_numbers(record), step=record["step"])

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() hands the last records to W&B's service process; teardown waits until it has written
        # them (its atexit hook would too, but torchrun may stop the process before that runs).
        wandb.teardown()


BUILTIN_SINKS: dict[str, Callable[[SinkRun], MetricsSink]] = {"tensorboard": TensorBoardSink, "wandb": WandbSink}


def known_sink_names() -> list[str]:
    """Built-in sink names, then the plugins' entry-point names (nothing is imported)."""
    plugins = sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} - set(BUILTIN_SINKS))
    return [*BUILTIN_SINKS, *plugins]


def _factory(name: str) -> Callable[[SinkRun], MetricsSink]:
    """The factory registered as ``name``; raises with a readable reason when there is none."""
    if name in BUILTIN_SINKS:
        return BUILTIN_SINKS[name]
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        raise LookupError(f"no metrics sink named {name!r} is installed (known: {', '.join(known_sink_names())})")
    factory = found[0].load()
    if not callable(factory):
        raise TypeError(f"entry point {found[0].value!r} is not callable")
    return factory


class Sinks:
    """The run's open sinks; each failure is reported once on ``stream`` and that sink is dropped."""

    def __init__(self, names: Iterable[str], run: SinkRun | None, *, stream: TextIO | None = None):
        """Open the sinks ``names`` for ``run`` (None only with no names: rank > 0, no run directory)."""
        self.stream = stream if stream is not None else sys.stderr
        self.open: dict[str, MetricsSink] = {}
        for name in dict.fromkeys(names):
            if run is None:
                raise ValueError("metrics sinks need a SinkRun")
            try:
                self.open[name] = _factory(name)(run)
            except Exception as exc:  # a broken plugin or a missing package must not stop training
                self._report(name, "could not start", exc)

    def _report(self, name: str, what: str, exc: BaseException) -> None:
        print(
            f"planc: metrics sink '{name}' {what}, skipped: {type(exc).__name__}: {exc}", file=self.stream, flush=True
        )

    def log(self, record: dict[str, Any]) -> None:
        for name, sink in list(self.open.items()):
            try:
                sink.log(record)
            except Exception as exc:
                self._report(name, f"failed at step {record.get('step')}", exc)
                self._close(name)

    def _close(self, name: str) -> None:
        sink = self.open.pop(name)
        try:
            sink.close()
        except Exception as exc:
            self._report(name, "failed to close", exc)

    def close(self) -> None:
        for name in list(self.open):
            self._close(name)

    def __enter__(self) -> Sinks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
