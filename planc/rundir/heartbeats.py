"""``heartbeats/rank-N.json``: each rank's latest step and state, rewritten (atomically) every step.

The routine beat at the start of every step (``beat(..., background=True)``) is written by a
background thread, so the step does not wait for the file system; every other beat -- the first
``training`` beat of an attempt, saves, failures, stops -- is on disk before :meth:`Heartbeat.beat`
returns.

A heartbeat is ``{"rank", "pid", "host", "attempt", "step", "state", "time", ...}``: ``step`` counts
the optimizer steps this rank has finished, ``state`` is one of

``starting``  ``training``  ``saving``  ``stopping``  ``timed_out``  ``failed``  ``deadline_exceeded``
``stopped``  ``finished``

and a ``timed_out`` or ``failed`` heartbeat carries the rank's ``message`` (and, for a timeout, the
``collective``). A rank that waits in a collective too long reads the others' heartbeats to name the
rank that never arrived; ``planc doctor`` reads them to report per-rank errors. Every rank must see
the run directory (a shared file system on several nodes, as for checkpoints).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

HEARTBEAT_DIR = "heartbeats"
#: States after which a rank does no more work in this attempt.
FINAL_STATES = ("timed_out", "failed", "deadline_exceeded", "stopped", "finished")


def heartbeat_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / HEARTBEAT_DIR / f"rank-{rank:05d}.json"


class Heartbeat:
    """One rank's heartbeat file; :meth:`beat` rewrites it and never raises."""

    def __init__(self, run_dir: str | Path, rank: int, attempt: int):
        self.path = heartbeat_path(run_dir, rank)
        self.fixed = {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(), "attempt": attempt}
        self.last: dict[str, Any] = {}
        self._lock = threading.RLock()  # a signal handler may beat while this thread is in beat()
        self._wake = threading.Event()
        self._writer: threading.Thread | None = None
        self._pending: tuple[int, dict[str, Any]] | None = None
        self._sequence = 0
        self._written = 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass

    def beat(self, step: int, state: str, *, background: bool = False, **detail: Any) -> None:
        """Record ``state`` after ``step`` finished steps. ``background``: the routine beat of a step,
        written off the step's critical path (a file write and a rename, ~1 ms on a loaded machine:
        4% of a 30 ms CPU step, bench/overhead.py); if the process dies first, the previous beat
        (written at once) still says which attempt and step it was in."""
        record = {**self.fixed, "step": step, "state": state, "time": round(time.time(), 3), **detail}
        self.last = record
        with self._lock:
            self._sequence += 1
            if background:
                self._pending = (self._sequence, record)
                self._start_writer()
                self._wake.set()
                return
            self._pending = None  # a newer record than any routine one still waiting
            self._write(self._sequence, record)

    def _start_writer(self) -> None:
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_pending, name="planc-heartbeat", daemon=True)
            self._writer.start()

    def _write_pending(self) -> None:
        while True:
            self._wake.wait()
            with self._lock:
                self._wake.clear()
                pending, self._pending = self._pending, None
                if pending is not None:
                    self._write(*pending)

    def _write(self, sequence: int, record: dict[str, Any]) -> None:
        """Write ``record`` unless a newer one is already on disk (called with the lock held)."""
        if sequence <= self._written:
            return
        self._written = sequence
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(record, default=str), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError:
            pass


def read_heartbeats(run_dir: str | Path) -> dict[int, dict[str, Any]]:
    """Every rank's last heartbeat, by rank (unreadable files are left out)."""
    folder = Path(run_dir) / HEARTBEAT_DIR
    beats: dict[int, dict[str, Any]] = {}
    try:
        paths = sorted(folder.glob("rank-*.json"))
    except OSError:
        return beats
    for path in paths:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            beats[record["rank"]] = record
    return beats
