"""A checkpoint's weights, checked against its manifest as ``planc export`` reads them.

A resume loads every file of a checkpoint and checks them all first
(:func:`planc.rundir.manifest.check_manifest`). The export needs the model's tensors alone, which
DCP's files mix with the optimizer state (twice the weights' bytes more under Adam): hashing whole
files read the checkpoint once in full, and the export then read the weights a second time. The
manifest's ``model_sha256`` (per DCP file, over its model items) is checked here from the bytes the
export loads, as DCP reads them: each byte of the weights is read once and checked, the
optimizer's are not read. The rest is checked before anything is loaded: every file's size, and
the SHA-256 of each file without a ``model_sha256`` (``.metadata``, which says where the items
lie, ``planc.json``, and every file of a checkpoint saved before ``model_sha256`` existed, which
is so checked whole, as before).
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import IO, Any

from planc.rundir.checkpoints import integrity_problems
from planc.rundir.manifest import items_digest, read_manifest
from planc.runtime.checkpoint import SafeFileSystemReader, model_item_ranges

#: (file, offset, length) of a DCP item -> the SHA-256 digest of its bytes as read.
Digests = dict[tuple[str, int, int], bytes]


class CheckedReader(SafeFileSystemReader):
    """DCP's reader that hashes each item's bytes as it hands them to DCP (into ``digests``).

    ``_slice_file`` is DCP's one place that opens an item's bytes; a DCP that no longer calls it
    leaves ``digests`` empty, and :meth:`WeightsCheck.problems` then reads the items itself."""

    def __init__(self, path: Path, digests: Digests):
        super().__init__(path)
        self.digests = digests

    def _slice_file(self, file: Any, sinfo: Any) -> IO[bytes]:
        file.seek(sinfo.offset)
        data = file.read(sinfo.length)
        self.digests[(sinfo.relative_path, sinfo.offset, sinfo.length)] = hashlib.sha256(data).digest()
        return io.BytesIO(data)


class WeightsCheck:
    """The manifest check of one checkpoint, split as the export reads it: :meth:`upfront_problems`
    before loading, :meth:`reader` for every load, :meth:`problems` once the weights are read."""

    def __init__(self, checkpoint: Path):
        self.checkpoint = checkpoint
        manifest = read_manifest(checkpoint)
        files = manifest["files"] if manifest is not None else {}
        self.expected = {
            name: entry["model_sha256"]
            for name, entry in files.items()
            if isinstance(entry, dict) and isinstance(entry.get("model_sha256"), str)
        }
        self.digests: Digests = {}

    def upfront_problems(self) -> list[str]:
        """Every file's size; the SHA-256 of every file whose weights are not checked as read."""
        manifest = read_manifest(self.checkpoint)
        names = manifest["files"] if manifest is not None else {}
        return integrity_problems(self.checkpoint, hash_names=[n for n in names if n not in self.expected])

    def reader(self) -> CheckedReader:
        return CheckedReader(self.checkpoint, self.digests)

    def problems(self) -> list[str]:
        """Each file's model items against its ``model_sha256``; an item no load read is read now,
        so the check covers every model byte of the checkpoint."""
        ranges = model_item_ranges(SafeFileSystemReader(self.checkpoint).read_metadata())
        found = []
        for name, expected in sorted(self.expected.items()):
            digests = [self._digest(name, offset, length) for offset, length in ranges.get(name, [])]
            if items_digest(digests) != expected:
                found.append(f"the model's weights in {name} do not match their SHA-256 in the manifest (corrupted)")
        return found

    def _digest(self, name: str, offset: int, length: int) -> bytes:
        key = (name, offset, length)
        if key not in self.digests:
            with open(self.checkpoint / name, "rb") as f:
                f.seek(offset)
                self.digests[key] = hashlib.sha256(f.read(length)).digest()
        return self.digests[key]
