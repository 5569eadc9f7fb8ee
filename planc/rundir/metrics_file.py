"""``metrics.jsonl`` as one trajectory: when a run resumes, the steps after its checkpoint leave the log.

A restart resumes from the newest checkpoint, which may be older than the last logged step; the
steps after it are trained again. :func:`rewind_metrics` moves the records of those steps to
``metrics.discarded.jsonl`` (each tagged with the step the run resumed from) before the first new
step is logged, so ``metrics.jsonl`` never holds two records of one step, and drops a line torn by a
crash, which a further append would merge with the next record.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
DISCARDED_FILE = "metrics.discarded.jsonl"


def _records(path: Path) -> tuple[list[dict[str, Any]], bool]:
    """The whole records of a JSON-lines file, and whether the file held anything else (torn lines)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return [], False
    records, torn = [], bool(text) and not text.endswith("\n")
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            torn = True
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            records.append(record)
        else:
            torn = True
    return records, torn


def read_metrics(run_dir: str | Path, name: str = METRICS_FILE) -> list[dict[str, Any]]:
    """The step records of ``run_dir/metrics.jsonl`` (a torn last line from a crash is skipped)."""
    return _records(Path(run_dir) / name)[0]


def rewind_metrics(run_dir: str | Path, step: int) -> int:
    """Keep the records of steps ``<= step`` in metrics.jsonl and move the others to metrics.discarded.jsonl.

    Returns how many records moved. The rewrite is atomic (a temporary file renamed over the log).
    """
    path = Path(run_dir) / METRICS_FILE
    records, torn = _records(path)
    kept = [r for r in records if r["step"] <= step]
    dropped = [r for r in records if r["step"] > step]
    if not dropped and not torn:
        return 0
    if dropped:
        stamp = {"discarded_at": round(time.time(), 3), "resumed_from_step": step}
        with open(Path(run_dir) / DISCARDED_FILE, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps({**r, **stamp}) + "\n" for r in dropped))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in kept))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(dropped)
