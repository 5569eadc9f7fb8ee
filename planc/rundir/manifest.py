"""``manifest.json``: the size and SHA-256 of every file of a checkpoint, written last, before it is published.

A checkpoint directory is published by a rename only after every rank's files are written and
flushed and the manifest lists them; :func:`check_manifest` then tells a truncated file, a missing
shard or a changed byte from a good checkpoint before anything is loaded. Hashing is split between
the ranks (:func:`share`): each reads back about ``1/world`` of the checkpoint, so a save costs one
extra read pass in total, from the page cache.

A DCP file's entry also has ``model_sha256``, computed in the same pass: the SHA-256 of the
concatenated SHA-256 digests of the file's model items (the byte ranges DCP's ``.metadata`` gives
the ``model.*`` tensors; optimizer state excluded), in offset order (:func:`items_digest`). It lets
``planc export``, which needs the weights alone, check every byte it reads as it reads it, without
a pass over the optimizer state (three times the weights' bytes under Adam).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1
_CHUNK = 1 << 20


def checkpoint_files(directory: str | Path) -> list[str]:
    """The files of a checkpoint directory that the manifest covers (every file but the manifest), sorted."""
    return sorted(entry.name for entry in Path(directory).iterdir() if entry.is_file() and entry.name != MANIFEST_FILE)


def share(names: Iterable[str], rank: int, world: int) -> list[str]:
    """The files ``rank`` hashes: every ``world``-th of the sorted names, starting at ``rank``."""
    return [name for index, name in enumerate(sorted(names)) if index % world == rank]


def describe(
    directory: str | Path, names: Iterable[str], model_items: Mapping[str, Sequence[tuple[int, int]]] | None = None
) -> dict[str, dict[str, Any]]:
    """``{name: {"bytes": size, "sha256": hex}}`` for the named files of ``directory``; a file in
    ``model_items`` (name -> the (offset, length) of its model items) gets ``model_sha256`` too."""
    entries = {}
    for name in names:
        path = Path(directory) / name
        ranges = model_items.get(name) if model_items is not None else None
        whole, items = _hash_file(path, ranges or ())
        entries[name] = {"bytes": path.stat().st_size, "sha256": whole}
        if ranges is not None:
            entries[name]["model_sha256"] = items_digest(items)
    return entries


def items_digest(digests: Iterable[bytes]) -> str:
    """``model_sha256``: the SHA-256 of the items' SHA-256 digests, concatenated in offset order."""
    return hashlib.sha256(b"".join(digests)).hexdigest()


def _hash_file(path: Path, ranges: Iterable[tuple[int, int]]) -> tuple[str, list[bytes]]:
    """The file's SHA-256 (hex) and the digest of each distinct (offset, length) range, in offset
    order, from one read of the file (ranges do not overlap: DCP writes each item once)."""
    spans = sorted(set(ranges))
    hashers = [hashlib.sha256() for _ in spans]
    whole = hashlib.sha256()
    position, first = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            whole.update(chunk)
            end, view = position + len(chunk), memoryview(chunk)
            index = first
            while index < len(spans) and spans[index][0] < end:
                low, high = max(spans[index][0], position), min(sum(spans[index]), end)
                if low < high:
                    hashers[index].update(view[low - position : high - position])
                index += 1
            while first < len(spans) and sum(spans[first]) <= end:
                first += 1  # finished: later chunks start past it
            position = end
    return whole.hexdigest(), [h.digest() for h in hashers]


def write_manifest(directory: str | Path, step: int, files: dict[str, dict[str, Any]]) -> None:
    """Write ``manifest.json`` and flush it and the directory to disk (the caller renames the directory next)."""
    path = Path(directory) / MANIFEST_FILE
    text = json.dumps({"format": MANIFEST_FORMAT, "step": step, "files": files}, indent=1, sort_keys=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    fsync_directory(directory)


def fsync_directory(directory: str | Path) -> None:
    """Flush a directory's entries (new files, renames) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_manifest(directory: str | Path) -> dict[str, Any] | None:
    try:
        data = json.loads((Path(directory) / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None


def check_manifest(directory: str | Path, *, hash_names: Iterable[str] | None = None) -> list[str]:
    """What is wrong with a checkpoint directory, as sentences (empty: nothing found).

    Sizes are checked for every listed file; SHA-256 for ``hash_names`` (default: every file; pass a
    :func:`share` to split the reading between ranks, or ``()`` to check sizes only).
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest is None:
        return [f"{MANIFEST_FILE} is missing or unreadable"]
    files: dict[str, Any] = manifest["files"]
    to_hash = set(files) if hash_names is None else set(hash_names)
    problems = []
    for name, entry in sorted(files.items()):
        path = directory / name
        try:
            size = path.stat().st_size
        except OSError:
            problems.append(f"{name} is missing")
            continue
        if size != entry.get("bytes"):
            problems.append(f"{name} has {size} bytes, the manifest says {entry.get('bytes')} (truncated or rewritten)")
        elif name in to_hash and describe(directory, [name])[name]["sha256"] != entry.get("sha256"):
            problems.append(f"{name} does not match its SHA-256 in the manifest (corrupted)")
    return problems
