"""Where verify results are kept, so that ``planc explain`` can show them beside its prediction.

``planc verify`` writes ``verify.json`` into the run directory and a copy into a results folder
keyed by the plan's content and chosen layout (:func:`plan_key`): ``$PLANC_VERIFY_DIR`` when
set, else ``~/.cache/planc/verify``. ``explain`` looks up the same key; a changed plan (any key
of model, hardware, train or layout) has another key, so a stale measurement is never shown.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from planc.fileio import write_text_atomically
from planc.spec import Layout, Plan

_IGNORED = ("source", "notes", "data_root")


def plan_key(plan: Plan, layout: Layout) -> str:
    """SHA-256 (first 16 hex digits) of the plan's content (not where it was read from) and the layout."""
    data = plan.model_dump(mode="json", exclude_computed_fields=True)
    for name in _IGNORED:
        data.pop(name, None)
    text = json.dumps({"plan": data, "layout": layout.model_dump(mode="json")}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def results_dir() -> Path:
    configured = os.environ.get("PLANC_VERIFY_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "planc" / "verify"


#: File names of the two kinds of result: a run of the program, a simulation (``--simulate``).
KINDS = {"verify": "verify", "simulate": "simulate"}


def save(result: dict, run_dir: Path, kind: str = "verify") -> Path:
    """Write ``result`` to ``run_dir/<kind>.json`` and to the results folder; returns the latter."""
    text = json.dumps(result, indent=1) + "\n"
    write_text_atomically(run_dir / f"{KINDS[kind]}.json", text)
    path = results_dir() / _file_name(result["key"], kind)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, text)
    except OSError:  # a read-only home: the run directory still has it
        return run_dir / f"{KINDS[kind]}.json"
    return path


def _file_name(key: str, kind: str) -> str:
    return f"{key}.json" if kind == "verify" else f"{key}-{KINDS[kind]}.json"


def load(plan: Plan, layout: Layout, kind: str = "verify") -> dict | None:
    """The newest result of ``kind`` ("verify" or "simulate") for this plan and layout, or None."""
    path = results_dir() / _file_name(plan_key(plan, layout), kind)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
