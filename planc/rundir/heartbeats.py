"""``heartbeats/rank-N.json``: each rank's latest step and state, rewritten (atomically) every step.

A heartbeat is ``{"rank", "pid", "host", "attempt", "step", "state", "time", ...}``: ``step`` counts
the optimizer steps this rank has finished, ``state`` is one of

``starting``  ``training``  ``saving``  ``stopping``  ``timed_out``  ``failed``  ``deadline_exceeded``
``stopped``  ``finished``

and a ``timed_out`` or ``failed`` heartbeat carries the rank's ``message`` (and, for a timeout, the
``collective``). A rank that waits in a collective too long reads the others' heartbeats to name the
rank that never arrived; ``planc doctor`` reads them to report per-rank errors. Every rank must see
the run directory (a shared file system on several nodes, as for checkpoints).

The beat before every step must cost nothing next to the step. Rewriting a file through a
temporary and ``os.replace``, or truncating it, costs ~4 ms per beat on this project's ext4 CI
machine (ext4's ``auto_da_alloc`` starts writing such a file's data back at once): 1-2% of a
small step. So a beat rewrites the open file in place instead: one ``pwrite`` of exactly
:data:`RECORD_BYTES` bytes at offset 0 (the JSON padded with spaces), a microsecond, no
truncation, no rename. A kill does not split so small a write to the page cache, and readers
read until two reads agree, so they never take a write in progress for a record. A record longer
than :data:`RECORD_BYTES` (a failure's message) falls back to the atomic temporary-and-rename,
and the next in-place beat reopens the new file.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

HEARTBEAT_DIR = "heartbeats"
#: The fixed size of an in-place heartbeat (a training beat is ~150 bytes).
RECORD_BYTES = 512
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
        self._fd: int | None = None  # the file, open for in-place beats
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass

    def beat(self, step: int, state: str, **detail: Any) -> None:
        record = {**self.fixed, "step": step, "state": state, "time": round(time.time(), 3), **detail}
        self.last = record
        data = json.dumps(record, default=str).encode("utf-8")
        try:
            if len(data) <= RECORD_BYTES:
                self._write_in_place(data.ljust(RECORD_BYTES))
            else:
                self._replace(data)
        except OSError:
            pass

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _write_in_place(self, data: bytes) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            if os.fstat(self._fd).st_size > RECORD_BYTES:  # a longer record was renamed in before
                os.ftruncate(self._fd, RECORD_BYTES)
        os.pwrite(self._fd, data, 0)

    def _replace(self, data: bytes) -> None:
        self.close()  # the rename puts a new file at the path; the next in-place beat opens it
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.path)


def newest_attempt(beats: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The heartbeats of the newest attempt among ``beats`` (by rank), lowest rank first: a rank
    of an earlier attempt that the restart did not reach again says nothing about the newest."""
    newest = max((beat.get("attempt", 0) for beat in beats.values()), default=0)
    return sorted((b for b in beats.values() if b.get("attempt", 0) == newest), key=lambda b: b["rank"])


def beat_step(beat: dict[str, Any]) -> int:
    """The step (1-based) a heartbeat's rank was in: the one it was training, saving or waiting in,
    else the one after the last it finished."""
    return beat.get("current_step", beat.get("step", 0) + 1)


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
            record = json.loads(_settled_text(path))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            beats[record["rank"]] = record
    return beats


def _settled_text(path: Path, attempts: int = 5) -> str:
    """The file's text once two reads in a row agree (a beat rewrites the file in place)."""
    text = path.read_bytes()
    for _ in range(attempts):
        again = path.read_bytes()
        if again == text:
            break
        text = again
    return text.decode("utf-8")
