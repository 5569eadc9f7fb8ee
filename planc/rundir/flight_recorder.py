"""``RUN_DIR/flight_recorder/rank-N``: the NCCL flight-recorder dumps of a collective timeout, read back.

On CUDA, `planc run` (and every command and Slurm script it prints) sets ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``
and ``TORCH_FR_DUMP_TEMP_FILE=flight_recorder/rank-`` (:data:`planc.codegen.emit.FLIGHT_RECORDER_ENV`):
when NCCL's watchdog finds a collective past the process group's timeout, it writes each rank's
record there and then aborts the process (SIGABRT), so the rank's Python never reports. planc's
own monitor (:class:`planc.runtime.hangs.HangMonitor`) reports first in the normal case; these
dumps are what is left when it could not. A dump is torch's pickle (what
``torch.distributed.flight_recorder`` reads): ``{"entries": [...], "pg_config": ..., "version": ...}``,
each entry a collective with its ``state`` ("scheduled", "started", "completed").

A rank whose newest collective never completed was waiting in it; a rank of the attempt whose dump
shows nothing pending, or that wrote none, is one the others waited for: it did not arrive. Only
plain data is unpickled (the run directory is the user's own).
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DIRECTORY = "flight_recorder"
PREFIX = "rank-"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")


@dataclass(frozen=True)
class FlightRecord:
    """One rank's dump: its newest collective, and whether that one was still pending."""

    rank: int
    newest: dict[str, Any] | None

    @property
    def waiting(self) -> bool:
        """The rank was inside a collective that never completed (it timed out waiting)."""
        return self.newest is not None and self.newest.get("state") != "completed"

    @property
    def collective(self) -> str:
        """``all_reduce #12 (default_pg)``, as the hang report names a collective."""
        if self.newest is None:
            return "no collective"
        entry = self.newest
        name = str(entry.get("profiling_name", "?")).split(":")[-1]
        seq = entry.get("p2p_seq_id") if entry.get("is_p2p") else entry.get("collective_seq_id")
        group = (list(entry.get("process_group") or []) + ["?", "?"])[:2]
        return f"{name} #{seq} ({group[1] or group[0]})"


#: How much earlier than ``since`` a dump's modification time may read and still count: file systems
#: stamp it from a coarse clock (ext4: the kernel's tick, up to 10 ms; FAT: 2 s), so a dump written
#: just after a heartbeat's ``time.time()`` can carry an older stamp. A restart takes longer than this.
MTIME_SLACK_S = 2.0


def read_flight_records(run_dir: str | Path | None, *, since: float = 0.0) -> dict[int, FlightRecord]:
    """Each rank's dump in ``run_dir`` written at or after ``since`` (a time.time(); the attempt's start),
    less :data:`MTIME_SLACK_S`, by global rank; a dump that cannot be read is skipped."""
    if run_dir is None:
        return {}
    folder = Path(run_dir) / DIRECTORY
    records = {}
    for path in sorted(folder.glob(f"{PREFIX}*")) if folder.is_dir() else []:
        match = _NAME.match(path.name)
        try:
            if match is None or path.stat().st_mtime < since - MTIME_SLACK_S:
                continue
            with path.open("rb") as handle:
                dump = pickle.load(handle)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError):
            continue
        entries = dump.get("entries") or [] if isinstance(dump, dict) else []
        newest = max(entries, key=lambda e: e.get("record_id", 0)) if entries else None
        records[int(match.group(1))] = FlightRecord(int(match.group(1)), newest)
    return records


def absent_ranks(records: dict[int, FlightRecord], ranks: list[int]) -> list[int]:
    """The ranks of ``ranks`` that the waiting ones waited for: no dump, or nothing pending in theirs."""
    return [rank for rank in ranks if rank not in records or not records[rank].waiting]


def timeout_words(records: dict[int, FlightRecord], ranks: list[int]) -> str | None:
    """``rank 0 timed out waiting in all_reduce #7 (...) (NCCL's watchdog aborted it; flight-recorder dump);
    did not arrive: rank(s) 1`` -- or None when no dump shows a rank waiting."""
    waiting = sorted(rank for rank, record in records.items() if record.waiting)
    if not waiting:
        return None
    first = records[waiting[0]]
    absent = absent_ranks(records, ranks)
    words = (
        f"rank {first.rank} timed out waiting in {first.collective} (NCCL's watchdog aborted it, SIGABRT; "
        f"flight-recorder dump in {DIRECTORY}/)"
    )
    if absent:
        return f"{words}; did not arrive: rank(s) {', '.join(map(str, absent))}"
    return f"{words}; every rank was waiting, in different collectives (a rank skipped or added one)"
