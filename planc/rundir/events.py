"""``events.jsonl``: what happened to a run, one JSON object per line, oldest first.

Every record has ``time`` (Unix seconds) and ``event``; the other fields depend on the event:

========================  ==========================================================================
``launch``                `planc run` started torchrun: world_size, layout, steps, max_restarts
``worker_failed``         torchrun saw a worker end: local_rank, pid, exitcode, signal (torchrun's wrapper)
``attempt``               a worker group started: attempt (0 = first, k = k-th restart), start_step,
                          checkpoint (the one resumed from, if any), world_size, layout
``checkpoint_saved``      step, path, seconds (and async: true for a background save)
``checkpoint_failed``     step, errors (rank -> message), previous (the intact checkpoint, if any)
``checkpoint_skipped``    step, path, problems: a corrupt checkpoint found on resume, renamed ``.corrupt``
``stop_requested``        signal, step: SIGTERM or Ctrl-C reached a rank
``stopped``               step, checkpoint (None when none could be saved), signal
``hang``                  step, collective, group, missing (ranks that did not arrive), waiting, timeout_s
``deadline_exceeded``     rank, step: a rank did not finish the step and its save within the stop deadline
``finished``              step: every step of the run is trained
``end``                   `planc run`'s own summary: status, exit code
========================  ==========================================================================

Writers: the launcher, torchrun's wrapper, and rank 0 of each attempt (the lowest waiting rank for a
hang). Each record is one ``write()`` on a file opened with ``O_APPEND``, so records of concurrent
writers do not interleave on a local file system; a torn line (a crash mid-write, or a network file
system without atomic appends) is skipped by :func:`read_events`.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"


def attempt_number() -> int:
    """Which start of the worker group this process belongs to: torchrun's restart count, plus the
    attempts of earlier torchrun agents of the same `planc run` (``PLANC_ATTEMPT_BASE``)."""
    return int(os.environ.get("PLANC_ATTEMPT_BASE", "0")) + int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def record_event(run_dir: str | Path | None, event: str, **fields: Any) -> bool:
    """Append one event to ``run_dir/events.jsonl``; returns False (and raises nothing) if it cannot be written."""
    if run_dir is None:
        return False
    line = json.dumps({"time": round(time.time(), 3), "event": event, **fields}, default=str) + "\n"
    try:
        fd = os.open(Path(run_dir) / EVENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def read_events(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every whole event of ``run_dir/events.jsonl``, oldest first (none when the file is missing)."""
    path = Path(run_dir) / EVENTS_FILE
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    events = []
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(item, dict) and "event" in item:
            events.append(item)
    return events


def last_event(events: list[dict[str, Any]], *names: str) -> dict[str, Any] | None:
    """The newest event whose name is one of ``names``."""
    for item in reversed(events):
        if item.get("event") in names:
            return item
    return None
