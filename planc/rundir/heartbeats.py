"""``heartbeats/rank-N.json``: each rank's latest step and state, rewritten (atomically) every step.

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
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass

    def beat(self, step: int, state: str, **detail: Any) -> None:
        record = {**self.fixed, "step": step, "state": state, "time": round(time.time(), 3), **detail}
        self.last = record
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
