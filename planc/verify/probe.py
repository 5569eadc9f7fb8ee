"""The measurement hook of the emitted program, for ``planc verify``.

The training loop calls :class:`StepProbe` in place of ``train_step`` when the environment
variable ``PLANC_VERIFY`` is set (``planc verify`` sets it; the program's text and arguments do
not change). Each step still runs ``train_step`` unchanged -- same data, same arithmetic; the
probe only watches, and one kind of measurement per step so that they do not disturb each other:

====  ==========  =======================================================================
step  measures    how
====  ==========  =======================================================================
1     nothing     warm-up: the optimizer creates its states, allocators and groups settle
2     time        the step's wall time, nothing installed
3     comm, act   :class:`~planc.verify.comm_counter.CommCounter` (bytes by collective and
                  mesh dimension) and :class:`~planc.verify.saved_activations.SavedActivations`
4     peak        torch's ``MemTracker`` (CPU; ``torch.cuda.max_memory_allocated`` on CUDA)
5     timeline    on CUDA: the step under ``torch.profiler``, its wall time split into compute,
                  exposed communication and idle device time (:mod:`~planc.verify.kernel_timeline`);
                  on CPU a timed step
6...  time        more timed steps (the median is reported)
====  ==========  =======================================================================

The steps are counted after those ``PLANC_VERIFY_UNMEASURED`` names, which run as the program
runs them, unwatched (a strategy that works as priced only after some steps).

After every step the rank writes ``verify/rank<R>.json`` in the run directory (model-state
bytes measured after the step, when gradients and optimizer states exist).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

from planc.runtime.step import train_step
from planc.verify.comm_counter import CommCounter, group_names
from planc.verify.model_states import model_state_bytes
from planc.verify.saved_activations import SavedActivations, measurable

#: The environment variable that turns the probe on.
ENVIRONMENT_VARIABLE = "PLANC_VERIFY"
#: Steps to run unmeasured before the first one above (``planc verify`` sets it where a strategy
#: works as its cost pass prices it only after some steps: :func:`planc.strategies.api` ``steady_after``).
UNMEASURED_VARIABLE = "PLANC_VERIFY_UNMEASURED"


def enabled() -> bool:
    return bool(os.environ.get(ENVIRONMENT_VARIABLE))


class StepProbe:
    """``probe(job, batch)`` runs one training step like ``train_step`` and records what it measured."""

    def __init__(self, job, out_dir) -> None:
        self.job = job
        self.path = Path(out_dir or ".") / "verify" / f"rank{dist.get_rank()}.json"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.index = 0
        self.unmeasured = int(os.environ.get(UNMEASURED_VARIABLE, "0"))
        self.record: dict = {"rank": dist.get_rank(), "coordinates": job.coordinates, "step_s": []}

    def __call__(self, job, batch, stop_requested: object = False, before_sync=None) -> dict:
        """One step, measured by phase; ``before_sync`` (the loop's next rows) runs after the step
        and its timing, so that verify's step times stay the step's own."""
        if self.unmeasured > 0:  # before the strategies run as priced: the program's own step
            self.unmeasured -= 1
            return train_step(job, batch, stop_requested, before_sync)
        phase = ("warmup", "time", "comm", "peak")[self.index] if self.index < 4 else "time"
        if self.index == 4 and job.device.type == "cuda":
            phase = "timeline"
        self.index += 1
        if phase == "comm":
            result = self._measure_comm_and_activations(batch, stop_requested)
        elif phase == "peak":
            result = self._measure_peak(batch, stop_requested)
        elif phase == "timeline":
            result = self._measure_timeline(batch, stop_requested)
        else:
            began = time.perf_counter()
            result = train_step(job, batch, stop_requested)
            self._synchronize()
            if phase == "time":
                self.record["step_s"].append(time.perf_counter() - began)
        self.record["model_states"] = model_state_bytes(job)
        self.record["device"] = job.device.type
        self.record["steps"] = self.index
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record, indent=1))
        tmp.replace(self.path)
        if before_sync is not None:
            before_sync()
        return result

    def _synchronize(self) -> None:
        if self.job.device.type == "cuda":
            torch.cuda.synchronize(self.job.device)

    def _measure_comm_and_activations(self, batch, stop_requested: object) -> dict:
        job = self.job
        names, sizes = group_names(job)
        saved = SavedActivations()
        with CommCounter(names, sizes) as counter, saved.step(job.unwrapped_parts()):
            result = train_step(job, batch, stop_requested)
            self._synchronize()
        self.record["comm"] = [
            {"kind": kind, "group": group, "bytes": counter.bytes[(kind, group)], "calls": counter.calls[(kind, group)]}
            for kind, group in sorted(counter.bytes)
        ]
        self.record["activations"] = saved.summary() if measurable(job) else None
        return result

    def _measure_timeline(self, batch, stop_requested: object) -> dict:
        """One step under ``torch.profiler`` (CUDA kernels only): its wall time split into compute,
        exposed communication and idle device time (:mod:`planc.verify.kernel_timeline`)."""
        import tempfile

        from torch.profiler import ProfilerActivity, profile

        from planc.verify.kernel_timeline import kernel_events, step_split

        self._synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as profiler:
            began = time.perf_counter()
            result = train_step(self.job, batch, stop_requested)
            self._synchronize()
            wall = time.perf_counter() - began
        with tempfile.TemporaryDirectory() as scratch:
            trace = Path(scratch) / "trace.json"
            profiler.export_chrome_trace(str(trace))
            self.record["timeline"] = step_split(kernel_events(trace), wall)
        return result

    def _measure_peak(self, batch, stop_requested: object) -> dict:
        job = self.job
        if job.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(job.device)
            result = train_step(job, batch, stop_requested)
            self._synchronize()
            self.record["peak"] = {
                "bytes": torch.cuda.max_memory_allocated(job.device),
                "reserved_bytes": torch.cuda.max_memory_reserved(job.device),
                "source": "cuda",
            }
            return result
        from planc.verify.peak_tracker import peak_by_category, tracking_the_step

        with tracking_the_step(job) as tracker:  # told of what the job made before it
            result = train_step(job, batch, stop_requested)
        self.record["peak"] = peak_by_category(tracker, job.device) | {
            "source": "torch.distributed._tools.mem_tracker.MemTracker"
        }
        return result
