"""Progress lines on rank 0 and ``metrics.jsonl``: one JSON object per optimizer step.

Each line is flushed as it is written, so a crash loses no finished step. A resumed run appends.
Fields of every record: ``step`` (1-based count of finished optimizer steps), ``loss``, ``lr``,
``step_s``, ``tokens_per_s``, ``grad_norm``, ``memory_bytes`` (the largest over the ranks, as
planc's prediction is for the worst device, of this step's peak: CUDA max allocated since the step
began, or the process's peak resident set on CPU, which only grows -- the interpreter, torch and
every buffer, not the tensors planc predicts; the progress line calls it ``mem`` on CUDA and ``rss``
on CPU),
``elapsed_s`` (wall time since this launch began), plus whatever extra fields the caller adds (the
loop adds ``mfu``, ``predicted_step_s``, ``predicted_mfu``, and ``val_loss``/``eval_s`` on
evaluation steps). The progress line ends with the
elapsed time and an estimate of the time left.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import torch

from planc.explain.totals import band_text

GIB = 1024**3


def peak_memory_bytes(device: torch.device | str | None = None) -> int:
    """Peak memory of this process: ``torch.cuda.max_memory_allocated`` on CUDA, peak RSS on CPU."""
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    return int(peak if sys.platform == "darwin" else peak * 1024)


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak for :func:`peak_memory_bytes`: on CUDA from now, so the next reading is one
    step's (not start-up's transients, such as initialisation or a checkpoint load); on CPU the kernel
    keeps the process's peak resident set, which cannot be reset."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory_label(device: torch.device | str | None = None) -> str:
    """What the progress line calls :func:`peak_memory_bytes`: ``mem`` (tensors, CUDA) or ``rss``
    (the whole process's resident set on CPU, a different quantity from any predicted memory)."""
    device = torch.device(device) if device is not None else None
    return "mem" if device is not None and device.type == "cuda" else "rss"


def _number(value: Any) -> Any:
    """A tensor or number as a plain JSON number (non-finite values as strings JSON can carry)."""
    if isinstance(value, torch.Tensor):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # "nan" / "inf": JSON has no literal for them
    return value


class MetricsLogger:
    """Writes ``metrics.jsonl`` and prints a progress line every ``print_every`` steps (rank 0 only)."""

    def __init__(
        self,
        path: str | Path | None,
        *,
        tokens_per_step: int,
        total_steps: int | None = None,
        rank: int = 0,
        print_every: int = 1,
        device: torch.device | str | None = None,
        stream: TextIO | None = None,
        predicted: Mapping[str, Any] | None = None,
    ):
        self.tokens_per_step = tokens_per_step
        self.predicted = predicted
        self.total_steps = total_steps
        self.active = rank == 0
        self.print_every = print_every
        self.device = device
        self.stream = stream if stream is not None else sys.stdout
        self._file: TextIO | None = None
        self._started = time.monotonic()
        self._steps_before: int | None = None  # finished steps when this launch began (resume)
        if self.active and path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")

    def log(
        self,
        step: int,
        *,
        loss: float,
        lr: float,
        step_s: float,
        grad_norm: float | None = None,
        memory_bytes: int | None = None,
        **extra: Any,
    ) -> dict[str, Any] | None:
        """Record finished step ``step``; returns the record (None on ranks other than 0)."""
        if not self.active:
            return None
        record = {
            "step": step,
            "loss": _number(loss),
            "lr": _number(lr),
            "step_s": step_s,
            "tokens_per_s": self.tokens_per_step / step_s if step_s > 0 else None,
            "grad_norm": _number(grad_norm),
            "memory_bytes": memory_bytes if memory_bytes is not None else peak_memory_bytes(self.device),
        }
        record.update({k: _number(v) for k, v in extra.items()})
        elapsed = record["elapsed_s"] = time.monotonic() - self._started
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        if step % self.print_every == 0 or step == self.total_steps:
            print(
                format_progress(
                    record,
                    self.total_steps,
                    eta_s=self._eta(step, elapsed),
                    memory=memory_label(self.device),
                    predicted=self.predicted,
                ),
                file=self.stream,
                flush=True,
            )
        return record

    def _eta(self, step: int, elapsed: float) -> float | None:
        """Seconds left at this launch's mean pace (evaluations and checkpoints included)."""
        if self._steps_before is None:
            self._steps_before = step - 1
        done = step - self._steps_before
        if not self.total_steps or done <= 0:
            return None
        return elapsed / done * max(0, self.total_steps - step)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def format_progress(
    record: dict[str, Any],
    total_steps: int | None = None,
    *,
    eta_s: float | None = None,
    memory: str = "mem",
    predicted: Mapping[str, Any] | None = None,
) -> str:
    """``step 12/100 | loss 3.2145 | val 3.3012 | lr 3.00e-04 | 12.3 k tok/s | 0.412 s/step (pred 0.380 ±9%) |
    mfu 31.0% (pred 33.6%) | grad 0.870 | mem 1.23 GiB | 0:05 elapsed, 0:36 left`` (parts shown when known;
    ``memory``: the memory's label, :func:`memory_label`; ``predicted``: the program's ``PREDICTED``,
    whose ``step_uncertainty`` gives the predicted step time's band)."""
    width = len(str(total_steps)) if total_steps else 1
    step = f"step {record['step']:>{width}}" + (f"/{total_steps}" if total_steps else "")
    loss = record["loss"]
    parts = [step, f"loss {loss:.4f}" if isinstance(loss, float) else f"loss {loss}"]
    if isinstance(record.get("val_loss"), float):
        parts.append(f"val {record['val_loss']:.4f}")
    parts.append(f"lr {record['lr']:.2e}")
    if record.get("tokens_per_s"):
        parts.append(f"{record['tokens_per_s'] / 1000:.1f} k tok/s")
    predicted_s = record.get("predicted_step_s")
    step_s = f"{record['step_s']:.3f} s/step"
    if predicted_s:
        step_s += f" ({_predicted_step(predicted_s, predicted)})"
    elif record.get("predicted_from_step"):  # a strategy's first steps, before it works as priced
        step_s += f" (pred from step {record['predicted_from_step']})"
    parts.append(step_s)
    if record.get("mfu") is not None:
        pred_mfu = record.get("predicted_mfu")
        parts.append(f"mfu {record['mfu']:.1%}" + (f" (pred {pred_mfu:.1%})" if pred_mfu is not None else ""))
    if isinstance(record.get("grad_norm"), float):
        parts.append(f"grad {record['grad_norm']:.3f}")
    parts.append(f"{memory} {record['memory_bytes'] / GIB:.2f} GiB")
    if record.get("elapsed_s") is not None:
        parts.append(
            f"{_clock(record['elapsed_s'])} elapsed" + (f", {_clock(eta_s)} left" if eta_s is not None else "")
        )
    return " | ".join(parts)


def _predicted_step(step_s: float, predicted: Mapping[str, Any] | None) -> str:
    """``pred 0.380 ±9%``, or ``pred 0.129, uncalibrated``: a measured step outside the band is news,
    one inside it not. The band comes from the prediction's number, ``step_uncertainty`` (relative;
    None when no published run calibrates the hardware), formatted as explain formats it, never
    from explain's words in ``step_band``, which may change. A program from before the number
    shows none."""
    if not predicted or "step_uncertainty" not in predicted:
        return f"pred {step_s:.3f}"
    band = predicted["step_uncertainty"]
    if band is None:
        return f"pred {step_s:.3f}, uncalibrated"
    return f"pred {step_s:.3f} {band_text(float(band))}"


def _clock(seconds: float) -> str:
    """``65 -> 1:05``, ``3725 -> 1:02:05``."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
