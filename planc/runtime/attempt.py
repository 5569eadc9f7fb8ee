"""One attempt of a run: everything the training loop does besides training.

torchrun starts the worker group once, and again after each failure (``--max-restarts``); each
start is an *attempt* (``TORCHELASTIC_RESTART_COUNT``). An :class:`Attempt` gives the loop

* :meth:`start` -- collective timeouts on every group, the newest checkpoint that checks out (or
  another run's, see :mod:`planc.runtime.resume`), "resumed from step N (checkpoint ...)",
  ``metrics.jsonl`` rewound to that step, and an ``attempt`` event naming why the last one ended;
* :meth:`guard` -- stop requests (SIGTERM, Ctrl-C) with a deadline, and failures turned into one
  line per rank (a lost peer, out of memory, a collective timeout naming who did not arrive: found
  by :class:`~planc.runtime.hangs.HangMonitor`, armed for each step, save and resume);
* :meth:`before_step` / :meth:`after_step` -- the heartbeat, test-only fault injection
  (:mod:`planc.runtime.faults`), the periodic checkpoint (published in the background with
  ``checkpoint.async_save``);
* :meth:`stop` and :meth:`finish` -- the last checkpoint, and the ``stopped``/``finished`` event.

A failed save (a full disk, an I/O error) is reported and training goes on: the previous checkpoint
is intact, and the next save tries again.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from planc.rundir.events import attempt_number, record_event
from planc.rundir.heartbeats import Heartbeat, beat_step, newest_attempt, read_heartbeats
from planc.rundir.metrics_file import rewind_metrics
from planc.runtime import faults, hangs
from planc.runtime.checkpoint_write import CheckpointSaveError, PendingSave, background_stager, start_save
from planc.runtime.local_shards import dtensor_parameters
from planc.runtime.preemption import StopRequest, exit_after_deadline, stop_on_signals
from planc.spec.checkpoint import DEFAULT_STOP_DEADLINE


class Attempt:
    def __init__(self, job, *, out_dir: str | Path | None, total_steps: int):
        plan = job.plan
        self.job, self.total_steps = job, total_steps
        self.rank = dist.get_rank()
        self.number = attempt_number()
        self.run_dir = Path(out_dir) if out_dir is not None else None
        spec = plan.checkpoint
        self.checkpoint_dir = self.run_dir / spec.dir if spec is not None and self.run_dir is not None else None
        self.background = spec is not None and spec.async_save
        self.deadline = spec.stop_deadline if spec is not None else DEFAULT_STOP_DEADLINE
        self.saved_step: int | None = None
        self.pending: PendingSave | None = None  # a background save not yet published
        # One host copy for every background save of this attempt (refilled, not reallocated).
        self.stager = background_stager(job.device) if self.background else None
        self.step = 0  # optimizer steps finished so far
        # The groups wait longer than the plan's timeout, so that the monitor reports first (runtime/hangs.py).
        hangs.apply_timeout(job, hangs.backend_timeout(plan.train.timeout))
        self.monitor = hangs.HangMonitor(plan.train.timeout, self._collective_hung)
        self._ending = threading.Lock()  # a timeout is reported once: by the monitor, or by the main thread
        # Rank 0 reads why the previous attempt ended before any rank overwrites its heartbeat.
        self.previous = read_heartbeats(self.run_dir) if self.run_dir and self.rank == 0 and self.number else {}
        self.heartbeat = Heartbeat(self.run_dir, self.rank, self.number) if self.run_dir is not None else None
        dist.barrier()
        self._beat("starting")

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> int:
        """Resume (or not) and say so; returns the number of finished steps to continue from."""
        from planc.runtime.resume import resume

        with self._explained_failures():
            self.monitor.arm(self.step + 1, "while resuming")
            point = resume(self.job, self.checkpoint_dir, self.run_dir, self._report)
            self.monitor.disarm()
        self.step = point.step if point is not None else 0
        self.saved_step = point.step if point is not None and not point.from_other_run else None
        if self.rank == 0:
            if self.number:
                causes = restart_causes(self.previous, self._previous_flight_records())
                limit = os.environ.get("PLANC_MAX_RESTARTS")
                of = f" of {limit}" if limit else ""
                print(f"planc: restart {self.number}{of}: {'; '.join(causes)}", flush=True)
            if point is not None:
                origin = " of another run" if point.from_other_run else ""
                print(f"resumed from step {point.step} (checkpoint {point.path}{origin})", flush=True)
            if self.run_dir is not None:
                rewind_metrics(self.run_dir, self.step)
            self._event(
                "attempt",
                start_step=self.step,
                target_step=self.total_steps,  # started in place by torchrun, no launch event says it
                checkpoint=str(point.path) if point is not None else None,
                world_size=dist.get_world_size(),
                layout=self.job.layout.describe(),
                causes=restart_causes(self.previous, self._previous_flight_records()) if self.number else [],
            )
        self._beat("training")
        return self.step

    # -- while training ------------------------------------------------------------------------

    @contextmanager
    def guard(self) -> Iterator[StopRequest]:
        """Stop requests (with the deadline watchdog) and explained failures, around the training loop."""
        with stop_on_signals(self.deadline, self._deadline_passed) as request, self._explained_failures():
            try:
                yield request
            finally:
                self.monitor.close()

    def before_step(self, step: int) -> None:
        """``step`` (1-based) is about to run."""
        self.monitor.arm(step)
        self._beat("training", current_step=step)
        faults.at_step_start(step)

    def after_step(self, step: int) -> None:
        """``step`` finished on every rank: publish a finished background save; save when one is due."""
        self.step = step
        self._poll_background_save()
        spec = self.job.plan.checkpoint
        if self.checkpoint_dir is not None and step % spec.every == 0:
            self.save(step)

    def save(self, step: int, *, blocking: bool = False) -> bool:
        """Checkpoint after ``step``; False when it failed (reported; the previous one is intact)."""
        self._finish_background_save()
        self.monitor.arm(self.step + 1, f"while saving the checkpoint of step {step}")
        self._beat("saving", current_step=step)
        began = time.perf_counter()
        spec = self.job.plan.checkpoint
        assert self.checkpoint_dir is not None and spec is not None, "save() needs the plan's checkpoint block"
        with dtensor_parameters(self.job):
            pending = start_save(
                self.checkpoint_dir,
                step,
                self.job.model_parts,
                self.job.optimizers,
                self.job.lr_schedulers,
                keep=spec.keep,
                background=self.background and not blocking,
                stager=self.stager,
                timeout=hangs.backend_timeout(self.job.plan.train.timeout),
            )
        pending.began = began
        if self.background and not blocking:
            self.pending = pending
            return True
        return self._publish(pending)

    # -- the end -------------------------------------------------------------------------------

    def stop(self, request: StopRequest) -> None:
        """Every rank agreed to stop after the step just finished: save there (unless just saved), record it."""
        step = self.step
        self._finish_background_save()
        self._close_stager()
        needs_save = self.checkpoint_dir is not None and self.saved_step != step
        if self.rank == 0:
            how = "interrupted" if request.signal == "SIGINT" else f"{request.signal or 'stop'} received"
            print(
                f"{how} after step {step}; " + ("saving a checkpoint, then " if needs_save else "") + "stopping",
                flush=True,
            )
        self._event("stop_requested", signal=request.signal, step=step)
        if needs_save:
            self.save(step, blocking=True)
        saved = self.saved_step == step
        self.monitor.disarm()
        self._event("stopped", step=step, signal=request.signal, checkpoint=self._path(step) if saved else None)
        self._beat("stopped")

    def finish(self) -> None:
        """Every step is trained: save the final state (unless saved at this step) and record it."""
        step = self.step
        self._finish_background_save()
        self._close_stager()
        if self.checkpoint_dir is not None and self.saved_step != step:
            self.save(step, blocking=True)
        self.monitor.disarm()
        self._event("finished", step=step, checkpoint=self._path(step) if self.saved_step == step else None)
        self._beat("finished")

    # -- helpers -------------------------------------------------------------------------------

    def _publish(self, pending) -> bool:
        try:
            path = pending.finish()
        except CheckpointSaveError as err:
            self._report("checkpoint_failed", f"planc: {err}", step=err.step, errors=err.errors, previous=err.previous)
            return False
        seconds = time.perf_counter() - pending.began
        self.saved_step = pending.step
        if self.rank == 0:
            print(f"checkpoint {path.name} saved ({seconds:.1f} s)", flush=True)
        self._event("checkpoint_saved", step=pending.step, path=str(path), seconds=round(seconds, 3))
        return True

    def _poll_background_save(self) -> None:
        """A background save is published once every rank has written its part (one all-reduce per step)."""
        if self.pending is None:
            return
        done = torch.tensor([1.0 if self.pending.written() else 0.0], device=self.job.device)
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if done.item() == 1.0:
            pending, self.pending = self.pending, None
            self._publish(pending)

    def _finish_background_save(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self.monitor.arm(self.step + 1, f"while publishing the checkpoint of step {pending.step}")
            self._publish(pending)

    def _close_stager(self) -> None:
        """The last save is blocking (or none is due): free the background saves' host copy."""
        if self.stager is not None:
            self.stager.close()
            self.stager = None

    def _path(self, step: int) -> str | None:
        from planc.rundir.checkpoints import step_dir

        return str(step_dir(self.checkpoint_dir, step)) if self.checkpoint_dir is not None else None

    def _beat(self, state: str, **detail: Any) -> None:
        if self.heartbeat is not None:
            self.heartbeat.beat(self.step, state, **detail)

    def _event(self, name: str, **fields: Any) -> None:
        if self.rank == 0:
            record_event(self.run_dir, name, attempt=self.number, **fields)

    def _report(self, name: str, message: str, **fields: Any) -> None:
        """Rank 0: print ``message`` on stderr and record the event."""
        if self.rank == 0:
            print(message, file=sys.stderr, flush=True)
            self._event(name, **fields)

    def _deadline_passed(self, signal_name: str) -> None:
        self._beat("deadline_exceeded")
        record_event(self.run_dir, "deadline_exceeded", attempt=self.number, rank=self.rank, step=self.step)
        exit_after_deadline(
            f"rank {self.rank}: still busy {self.deadline:g} s after {signal_name} (step {self.step + 1} or its "
            f"checkpoint did not finish within the stop deadline, checkpoint.stop_deadline); exiting. The newest "
            "complete checkpoint is intact. Where this rank was:"
        )

    def _previous_flight_records(self) -> dict:
        """The NCCL flight-recorder dumps the previous attempt left (on rank 0 of a restart)."""
        from planc.rundir.flight_recorder import read_flight_records

        since = min((float(b.get("time", 0)) for b in newest_attempt(self.previous)), default=0.0)
        return read_flight_records(self.run_dir, since=since) if self.previous else {}

    def _collective_hung(self, step: int, phase: str | None) -> None:
        """From the monitor's thread: this rank waited ``train.timeout`` in a collective of ``step``'s ``phase``."""
        self._end_on_timeout(step, phase, by="monitor")

    def _end_on_timeout(self, step: int, phase: str | None = None, *, by: str) -> None:
        """Report a collective timeout (naming the ranks that did not arrive), record it (``by``: who
        found it, "monitor" or "backend"), and exit 1.

        The monitor's thread and the main thread (gloo raising once the groups' longer timeout passed)
        may both get here: the first reports and ends the process, the other waits for that."""
        self._ending.acquire()
        timeout = self.job.plan.train.timeout
        message, fields = hangs.report_timeout(
            self.job, step=step, heartbeat=self.heartbeat, run_dir=self.run_dir, timeout=timeout, phase=phase
        )
        if fields["waiting"] and self.rank == min(fields["waiting"]):
            record_event(self.run_dir, "hang", attempt=self.number, by=by, **fields)
        self._beat("timed_out", current_step=step, collective=fields["collective"], message=message)
        print(message, file=sys.stderr, flush=True)
        # At once: the process group is broken, and tearing it down at interpreter exit can wait on
        # the collective that never completes (seconds, or forever with NCCL).
        sys.stdout.flush()
        os._exit(1)

    @contextmanager
    def _explained_failures(self) -> Iterator[None]:
        """A lost peer, out of memory or a collective timeout ends this rank with one line (exit 1);
        other errors keep their traceback. Either way the heartbeat records it for `planc doctor`."""
        from planc.runtime.data import DataError
        from planc.runtime.failures import describe_failure

        try:
            yield
        except DataError as exc:  # found mid-run (an id beyond the vocabulary) in this rank's rows
            self._beat("failed", message=_one_line(exc))
            # Each rank reads only its data-parallel share: every rank that holds the id finds it (the
            # others then lose contact with it). One line per share: its first tensor/pipeline rank's.
            if not any(self.job.coordinates.get(dim, 0) for dim in ("tp", "pp")):
                print(f"planc: {exc}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)
        except Exception as exc:
            step = self.step + 1
            if hangs.is_timeout(exc):  # the backend's timeout, where the monitor could not report first
                self._end_on_timeout(step, by="backend")
            with self._ending:  # not while the monitor reports a timeout (it ends the process)
                message = describe_failure(exc, rank=self.rank, step=step)
                recorded = describe_failure(exc, rank=self.rank, step=step, printed=False)
            self._beat("failed", message=recorded or _one_line(exc))
            if message is None:
                raise
            print(message, file=sys.stderr, flush=True)
            # At once: the process group is broken, and tearing it down at interpreter exit can wait on
            # the collective that never completes (seconds, or forever with NCCL).
            sys.stdout.flush()
            os._exit(1)


def restart_causes(previous: dict[int, dict[str, Any]], flight_records: dict | None = None) -> list[str]:
    """Why the previous attempt ended, from its heartbeats: each rank that failed, timed out or went silent.

    ``flight_records`` (:func:`planc.rundir.flight_recorder.read_flight_records`): NCCL's dumps of the
    attempt. NCCL's watchdog aborts a rank that waited past the groups' timeout before it can write
    a word (when planc's monitor did not report first), so a rank whose dump shows a collective
    pending timed out waiting, and the others of the attempt did not arrive."""
    if not previous:
        return ["no heartbeats of the previous attempt"]
    beats = newest_attempt(previous)
    waiting = {rank for rank, record in (flight_records or {}).items() if record.waiting}
    causes = []
    for beat in beats:
        state, rank = beat.get("state"), beat["rank"]
        step = beat_step(beat)
        where = f"while saving the checkpoint of step {step}" if state == "saving" else f"in step {step}"
        if waiting and state != "timed_out":
            if rank in waiting:
                collective = flight_records[rank].collective  # type: ignore[index]
                causes.append(
                    f"rank {rank} timed out waiting in {collective} {where} (NCCL's watchdog aborted it; "
                    "flight-recorder dump)"
                )
            else:
                causes.append(f"rank {rank} did not arrive {where}: the others waited for it in a collective")
        elif state in ("training", "saving", "starting", "stopping"):
            causes.append(f"rank {rank} stopped without a word {where} (killed, or its node was lost)")
        elif state == "timed_out":
            causes.append(f"rank {rank} timed out waiting in a collective {where}")
        elif state == "deadline_exceeded":
            causes.append(f"rank {rank} missed its stop deadline {where}")
    if not causes:
        failed = [b for b in beats if b.get("state") == "failed"]
        causes = [f"rank {b['rank']}: {b.get('message', 'failed')}" for b in failed[:2]]
    if not causes and beats and all(b.get("state") == "stopped" for b in beats):
        step = max(b.get("step", 0) for b in beats)
        causes = [f"every rank stopped on a signal after step {step} and saved: its torchrun agent was lost"]
    return causes[:4] or ["unknown (no rank recorded an error)"]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
