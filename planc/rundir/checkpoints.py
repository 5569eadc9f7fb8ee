"""The checkpoints of a run directory on disk: names, completeness and integrity (no torch needed).

::

    <dir>/step-00000100/          complete: renamed from .tmp after every rank wrote it; has planc.json
                                  and (format 2) manifest.json
    <dir>/step-00000200.tmp/      being written, or abandoned by a crash: never loaded
    <dir>/step-00000150.corrupt/  failed its manifest check on resume: skipped, kept for inspection

:mod:`planc.runtime.checkpoint` writes and loads them; the launcher and ``planc doctor`` list them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planc.rundir.manifest import check_manifest

#: Directory name of a complete checkpoint; the step is zero-padded so names sort by step.
STEP_DIR = "step-{step:08d}"
COMPLETE = re.compile(r"^step-(\d+)$")
INCOMPLETE = re.compile(r"^step-(\d+)\.tmp$")
CORRUPT = re.compile(r"^step-(\d+)\.corrupt$")
METADATA_FILE = "planc.json"
#: 1: DCP files + planc.json; 2: and manifest.json (sizes and hashes), checked before loading.
FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)


@dataclass(frozen=True)
class CheckpointEntry:
    step: int
    path: Path
    state: str  # "complete" | "partial" | "corrupt"


def step_dir(directory: str | Path, step: int) -> Path:
    return Path(directory) / STEP_DIR.format(step=step)


def list_checkpoints(directory: str | Path) -> list[CheckpointEntry]:
    """Every checkpoint directory, complete or not, by step then name."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        for pattern, state in ((COMPLETE, "complete"), (INCOMPLETE, "partial"), (CORRUPT, "corrupt")):
            match = pattern.match(entry.name)
            if match and entry.is_dir():
                if state == "complete" and not (entry / METADATA_FILE).is_file():
                    state = "partial"  # renamed by hand, or a copy that stopped half-way
                found.append(CheckpointEntry(int(match.group(1)), entry, state))
    return sorted(found, key=lambda e: (e.step, e.path.name))


def complete_steps(directory: str | Path) -> list[int]:
    """Steps of the complete checkpoints in ``directory``, oldest first (``.tmp`` ones are ignored)."""
    return [entry.step for entry in list_checkpoints(directory) if entry.state == "complete"]


def latest_step(directory: str | Path) -> int | None:
    """The step of the newest complete checkpoint, or None."""
    steps = complete_steps(directory)
    return steps[-1] if steps else None


def read_metadata(path: str | Path) -> dict[str, Any]:
    """A checkpoint's ``planc.json`` (raises OSError or ValueError when it cannot be read)."""
    data = json.loads((Path(path) / METADATA_FILE).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{METADATA_FILE} holds a {type(data).__name__}, not an object")
    return data


def integrity_problems(path: str | Path, *, hash_names=None) -> list[str]:
    """What makes the checkpoint at ``path`` unusable (empty when it checks out).

    Format 2 checkpoints are checked against their manifest (sizes always; SHA-256 of ``hash_names``,
    default all); format 1 checkpoints (no manifest) only for a readable ``planc.json``.
    """
    try:
        metadata = read_metadata(path)
    except (OSError, ValueError) as err:
        return [f"{METADATA_FILE} is unreadable: {err}"]
    version = metadata.get("format")
    if version not in READABLE_FORMATS:
        return [f"checkpoint format {version!r}; this planc reads {', '.join(map(str, READABLE_FORMATS))}"]
    if version == 1:
        return []
    return check_manifest(path, hash_names=hash_names)
