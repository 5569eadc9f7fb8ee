"""Collective timeouts that end every rank with a report: which rank did not arrive, which collective, which step.

PyTorch's own means do the detecting, and a monitor thread of planc's does the reporting:

* **the monitor.** :class:`HangMonitor`, one thread per rank (like the stop deadline's timer), is
  armed as each step, checkpoint save or resume begins. Once the phase has run ``train.timeout``
  seconds it looks at this rank's newest collective (below): one started in this phase that has not
  completed and is older than the timeout means this rank is waiting for one that never arrives;
  it then reports (:func:`report_timeout`) and ends the rank with status 1. A rank with no such
  collective (the one stuck in Python or in data loading, or a slow step) is left alone.
  It must report from Python because NCCL's own timeout never reaches Python: its watchdog thread
  aborts the process (SIGABRT; ``TORCH_NCCL_ASYNC_ERROR_HANDLING``'s default tears it down), while
  the main thread waits in a CUDA sync such as ``.item()``, which has no timeout at all.
* **process-group timeouts.** Every group of the job (:func:`job_groups`) gets
  :func:`backend_timeout`: ``train.timeout`` plus the time the monitor's report needs, so the
  monitor always fires first; the backend's timeout is the backstop. Gloo then raises in the waiting
  rank (reported the same way, :func:`is_timeout`); NCCL aborts, and the launcher reads the dumps below.
* **the flight recorder.** ``TORCH_FR_BUFFER_SIZE`` (set here unless the user set it) makes c10d
  record each rank's recent collectives -- gloo as well as NCCL in torch >= 2.9. A rank reads its
  own newest entry: the collective, its sequence number, its group, its sizes, its creation time
  and (NCCL only; gloo's stay "scheduled") whether it completed. On CUDA the launch environment
  also sets ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` and ``TORCH_FR_DUMP_TEMP_FILE`` (:mod:`planc.codegen.emit`),
  so that when NCCL's watchdog does fire, each rank's record is dumped into
  ``RUN_DIR/flight_recorder/`` (:mod:`planc.rundir.flight_recorder` reads them for the launcher's
  last line and the restart's causes; ``python -m torch.distributed.flight_recorder.fr_trace``
  reads them too). The NCCL path has never run here (no GPU).
* **heartbeats.** A rank that timed out marks its heartbeat ``timed_out`` and waits a short grace for
  the others to do the same; a member of the collective's group that never does is the one that did
  not arrive (blocked, deadlocked, or skipping the collective), and its own heartbeat says where it
  last was. When every rank timed out, in different collectives, the ranks disagree on the order of
  collectives (one skipped or added one), and the report lists each rank's.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from planc.rundir.heartbeats import FINAL_STATES, read_heartbeats

#: Recent collectives the flight recorder keeps per rank (a few steps' worth for a large model).
FLIGHT_RECORDER_ENTRIES = "2000"
_TIMEOUT = re.compile(r"Timed out waiting \d+ ?ms|collective operation timeout|Watchdog caught collective", re.I)
#: The report's longest wait for the other ranks' heartbeats (:func:`report_grace`).
REPORT_GRACE_S = 10.0
#: Beyond that grace, what the monitor may need to notice the hang (its polling interval), read the
#: flight recorder, print and exit, before the backend's own timeout may end the process instead.
MONITOR_SLACK_S = 5.0
#: How often a monitor whose phase is past the timeout looks again (at most; less for short timeouts).
POLL_S = 1.0


def enable_flight_recorder() -> None:
    """Before ``init_process_group``: record each rank's recent collectives (unless the user chose a size);
    make the folder NCCL dumps them into on a timeout (each node's ranks, shared run directory or not)."""
    if "TORCH_FR_BUFFER_SIZE" not in os.environ and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ:
        os.environ["TORCH_FR_BUFFER_SIZE"] = FLIGHT_RECORDER_ENTRIES
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    if prefix:
        try:
            Path(prefix).parent.mkdir(parents=True, exist_ok=True)
        except OSError:  # no dumps then; the hang report does not need them
            pass


def report_grace(timeout: float) -> float:
    """How long a report waits for the other ranks' heartbeats: ``min(timeout, 10 s)``."""
    return min(timeout, REPORT_GRACE_S)


def backend_timeout(timeout: float) -> float:
    """The process groups' timeout for a plan's ``train.timeout``: that plus the monitor's report
    (its heartbeat grace and :data:`MONITOR_SLACK_S`), so that the monitor, which fires at
    ``timeout``, has reported before NCCL's watchdog aborts the process (or gloo raises)."""
    return timeout + report_grace(timeout) + MONITOR_SLACK_S


def job_groups(job) -> list[Any]:
    """Every process group the job's collectives run on: the default one, each mesh dimension's, HSDP's
    shard and replicate groups, tied weights'. (The background checkpoint's gloo group is made later,
    with the timeout: :func:`planc.runtime.checkpoint_write.start_save`.)"""
    groups = [dist.distributed_c10d._get_default_group()]
    for mesh in (job.mesh, job.shard_mesh):
        if mesh is not None:
            groups += [mesh.get_group(name) for name in mesh.mesh_dim_names]
    groups += [tied.group for tied in job.tied_weights if tied.group is not None]
    unique: dict[int, Any] = {}
    for group in groups:
        unique.setdefault(id(group), group)
    return list(unique.values())


def apply_timeout(job, seconds: float) -> None:
    """Give every group of the job the collective timeout ``seconds`` (:func:`backend_timeout` of the plan's)."""
    timeout = timedelta(seconds=seconds)
    for group in job_groups(job):
        group.set_timeout(timeout)


class HangMonitor:
    """A thread that reports a collective timeout from Python before the backend's own ends the process.

    :meth:`arm` as a phase (a step, a checkpoint save, the resume) begins; :meth:`disarm` when no
    phase runs; :meth:`close` at the end. From ``timeout`` seconds after :meth:`arm`, it calls
    ``on_hang(step, phase)`` (once; it is expected to end the process) as soon as
    :func:`seconds_until_hung` says so for the flight recorder's newest entry (``newest``).
    """

    def __init__(
        self,
        timeout: float,
        on_hang: Callable[[int, str | None], None],
        *,
        newest: Callable[[], dict[str, Any] | None] | None = None,
    ) -> None:
        self.timeout, self._on_hang = timeout, on_hang
        self._newest = newest or newest_entry
        self._poll = min(POLL_S, timeout / 10)
        self._lock = threading.Condition()
        self._phase: tuple[int, str | None, int] | None = None  # (step, phase, armed at: time.time_ns())
        self._closed = False
        self._idle = False  # the thread waits with no phase armed, for arm() to wake it
        self._thread: threading.Thread | None = None

    def arm(self, step: int, phase: str | None = None) -> None:
        """A phase of step ``step`` begins (``phase``: None for the step itself, else its words, e.g.
        "while saving the checkpoint of step 4").

        Wakes the thread only when it waits with no phase: one that sleeps until an earlier phase's
        deadline finds the new phase when it wakes (each phase's deadline is later), so a step
        costs no wake-up. Waking it every step cost rank 0 ~2 ms of CPU per step in
        ``bench/overhead.py``'s DDP case (4% of the step; CPU-time ratio to hand-written 1.047 ->
        1.001 without the wake-ups)."""
        with self._lock:
            self._phase = (step, phase, time.time_ns())
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="planc-hang-monitor", daemon=True)
                self._thread.start()
            if self._idle:
                self._lock.notify()

    def disarm(self) -> None:
        """No phase runs: the thread, asleep until the last phase's deadline, then finds none."""
        with self._lock:
            self._phase = None

    def close(self) -> None:
        """Stop the thread (joined: a thread left to interpreter shutdown can abort the process from C++)."""
        with self._lock:
            self._closed, self._phase = True, None
            self._lock.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        with self._lock:
            while not self._closed:
                phase = self._phase
                if phase is None:
                    self._idle = True
                    self._lock.wait()
                    self._idle = False
                    continue
                wait = self._seconds_left(phase[2])
                if wait <= 0:
                    break
                self._lock.wait(timeout=wait)
            else:
                return
        self._on_hang(phase[0], phase[1])

    def _seconds_left(self, armed_ns: int) -> float:
        """Seconds until the phase armed at ``armed_ns`` counts as hung (<= 0: now)."""
        now = time.time_ns()
        until_checked = armed_ns / 1e9 + self.timeout - now / 1e9
        if until_checked > 0:  # no collective of the phase can be older than the timeout yet
            return until_checked
        left = seconds_until_hung(self._newest(), armed_ns=armed_ns, now_ns=now, timeout=self.timeout)
        return self._poll if left is None else max(left, 0.0)


def seconds_until_hung(entry: dict[str, Any] | None, *, armed_ns: int, now_ns: int, timeout: float) -> float | None:
    """When this rank counts as waiting too long in flight-recorder entry ``entry``, its newest collective.

    None when it waits in none: no entry, one created before the phase began (armed at ``armed_ns``;
    this rank then has not joined any collective of the phase: it is the one the others wait for, or
    its phase is merely slow), or one that completed (NCCL records completion; gloo's entries stay
    "scheduled", so there a rank counts as waiting in its newest collective while its phase runs).
    Else the seconds until that collective is ``timeout`` old (<= 0: it is).
    """
    if entry is None or entry.get("state") == "completed":
        return None
    created = int(entry.get("time_created_ns") or 0)
    if created < armed_ns:
        return None
    return timeout - (now_ns - created) / 1e9


def newest_entry() -> dict[str, Any] | None:
    """This rank's newest flight-recorder entry (None when there is no recorder or no entry yet)."""
    try:
        from torch._C import _distributed_c10d

        # Private (torch 2.5+, no type stub): the flight recorder's ring buffer as JSON.
        dump = _distributed_c10d._dump_fr_trace_json  # type: ignore[attr-defined]
        entries = json.loads(dump(True, False)).get("entries") or []
    except Exception:  # no recorder in this build or backend: report without the collective's name
        return None
    return max(entries, key=lambda e: e.get("record_id", 0)) if entries else None


def is_timeout(exc: BaseException) -> bool:
    return _TIMEOUT.search(str(exc)) is not None


def last_collective(job) -> dict[str, Any] | None:
    """This rank's newest flight-recorder entry: ``{"name", "seq", "group", "ranks", "sizes"}`` (None if unknown)."""
    entry = newest_entry()
    if entry is None:
        return None
    group_name, group_desc = (list(entry.get("process_group") or []) + ["?", "?"])[:2]
    ranks = {g.group_name: dist.get_process_group_ranks(g) for g in job_groups(job)}.get(group_name)
    return {
        "name": str(entry.get("profiling_name", "?")).split(":")[-1],
        "seq": entry.get("collective_seq_id") if not entry.get("is_p2p") else entry.get("p2p_seq_id"),
        "group": group_desc or group_name,
        "ranks": ranks,
        "sizes": entry.get("input_sizes"),
    }


def report_timeout(job, *, step: int, heartbeat, run_dir, timeout: float, phase: str | None = None) -> tuple[str, dict]:
    """The one-line report of a collective timeout on this rank in step ``step`` (or ``phase`` of it),
    and the ``hang`` event's fields.

    Marks this rank ``timed_out`` in its heartbeat, then waits up to :func:`report_grace` for the
    other ranks' heartbeats to settle before naming the ones that did not arrive.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    collective = last_collective(job)
    where = _describe_collective(collective)
    if heartbeat is not None:
        heartbeat.beat(step - 1, "timed_out", current_step=step, collective=collective)
    beats = _settled_heartbeats(run_dir, heartbeat, world, grace=report_grace(timeout)) if run_dir is not None else {}
    attempt = heartbeat.fixed["attempt"] if heartbeat is not None else None
    waiting = sorted(r for r, b in beats.items() if b.get("attempt") == attempt and b.get("state") == "timed_out")
    members = (collective or {}).get("ranks") or list(range(world))
    missing = [r for r in members if r not in waiting and (r != rank)]
    fields: dict[str, Any] = {
        "step": step,
        "collective": collective,
        "waiting": waiting,
        "missing": missing,
        "timeout_s": timeout,
    }
    if phase is not None:
        fields["phase"] = phase
    head = f"rank {rank}: collective timeout {phase or f'in step {step}'}: {where} waited {timeout:g} s"
    if not beats:
        return f"{head} for a rank that never arrived (no run directory, so no heartbeats to name it)", fields
    if missing:
        said = "; ".join(f"rank {r} {_last_seen(beats.get(r), attempt)}" for r in missing[:8])
        return f"{head}; did not arrive: {said}", fields
    others = [beats[r] for r in waiting if r != rank and beats[r].get("collective")]
    mismatch = ", ".join(f"rank {b['rank']} in {_describe_collective(b.get('collective'))}" for b in others[:6])
    return (
        f"{head}; every rank of the group timed out, in different collectives ({mismatch}): a rank skipped "
        "or added a collective, so the ranks no longer agree on their order",
        fields,
    )


def _describe_collective(collective: dict[str, Any] | None) -> str:
    if not collective:
        return "a collective"
    ranks = collective.get("ranks")
    over = f" over ranks {_ranks_text(ranks)}" if ranks else ""
    return f"{collective['name']} #{collective['seq']} ({collective['group']}{over})"


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def _last_seen(beat: dict[str, Any] | None, attempt: int | None) -> str:
    if beat is None or beat.get("attempt") != attempt:
        return "(no heartbeat in this attempt: it never started, or the run directory is not shared by its node)"
    ago = time.time() - float(beat.get("time", 0))
    return (
        f"(last heartbeat {ago:.1f} s ago: {beat.get('state')}, {beat.get('step')} step(s) done, "
        f"pid {beat.get('pid')} on {beat.get('host')})"
    )


def _settled_heartbeats(run_dir, heartbeat, world: int, *, grace: float) -> dict[int, dict[str, Any]]:
    """The heartbeats once every rank of this attempt has finished (timed out, failed, ...) or ``grace`` passed."""
    attempt = heartbeat.fixed["attempt"] if heartbeat is not None else None
    deadline = time.monotonic() + grace
    while True:
        beats = read_heartbeats(run_dir)
        settled = all(
            beats.get(r, {}).get("attempt") == attempt and beats[r].get("state") in FINAL_STATES for r in range(world)
        )
        if settled or time.monotonic() >= deadline:
            return beats
        time.sleep(0.2)
