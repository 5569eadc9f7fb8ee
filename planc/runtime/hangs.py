"""Collective timeouts that end every rank with a report: which rank did not arrive, which collective, which step.

PyTorch's own means do the detecting:

* **process-group timeouts.** ``train.timeout`` goes to ``init_process_group(timeout=...)`` and, with
  ``ProcessGroup.set_timeout``, to every group of the device mesh and the tied-embedding groups
  (groups made by ``new_group`` otherwise keep the backend's default of 30 minutes for gloo). Gloo
  raises in the waiting rank when a collective exceeds it; NCCL's watchdog aborts the communicator.
* **the flight recorder.** ``TORCH_FR_BUFFER_SIZE`` (set here unless the user set it) makes c10d
  record each rank's recent collectives -- gloo as well as NCCL in torch >= 2.9. A rank that timed
  out reads its own last entry: the collective, its sequence number, its group and sizes. On NCCL,
  `planc run` also sets ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` and ``TORCH_FR_DUMP_TEMP_FILE`` so that each
  rank's record is dumped into ``RUN_DIR/flight_recorder/`` (read them with
  ``python -m torch.distributed.flight_recorder.fr_trace``). The NCCL path has never run here (no GPU).
* **heartbeats.** A rank that timed out marks its heartbeat ``timed_out`` and waits a short grace for
  the others to do the same; a member of the collective's group that never does is the one that did
  not arrive (blocked, deadlocked, or skipping the collective), and its own heartbeat says where it
  last was. When every rank timed out, in different collectives, the ranks disagree on the order of
  collectives (one skipped or added one), and the report lists each rank's.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from planc.rundir.heartbeats import FINAL_STATES, read_heartbeats

#: Recent collectives the flight recorder keeps per rank (a few steps' worth for a large model).
FLIGHT_RECORDER_ENTRIES = "2000"
_TIMEOUT = re.compile(r"Timed out waiting \d+ ?ms|collective operation timeout|Watchdog caught collective", re.I)


def enable_flight_recorder() -> None:
    """Before ``init_process_group``: record each rank's recent collectives (unless the user chose a size)."""
    if "TORCH_FR_BUFFER_SIZE" not in os.environ and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ:
        os.environ["TORCH_FR_BUFFER_SIZE"] = FLIGHT_RECORDER_ENTRIES


def job_groups(job) -> list[Any]:
    """Every process group the job's collectives run on: the default one, each mesh dimension's, HSDP's
    shard and replicate groups, tied weights'. (The background checkpoint's gloo group is made later,
    with the timeout: :func:`planc.runtime.checkpoint_write.start_save`.)"""
    groups = [dist.distributed_c10d._get_default_group()]
    for mesh in (job.mesh, job.shard_mesh):
        if mesh is not None:
            groups += [mesh.get_group(name) for name in mesh.mesh_dim_names]
    groups += [tied.group for tied in job.tied_weights if tied.group is not None]
    unique: dict[int, Any] = {}
    for group in groups:
        unique.setdefault(id(group), group)
    return list(unique.values())


def apply_timeout(job, seconds: float) -> None:
    """Give every group of the job the plan's collective timeout."""
    timeout = timedelta(seconds=seconds)
    for group in job_groups(job):
        group.set_timeout(timeout)


def is_timeout(exc: BaseException) -> bool:
    return _TIMEOUT.search(str(exc)) is not None


def last_collective(job) -> dict[str, Any] | None:
    """This rank's newest flight-recorder entry: ``{"name", "seq", "group", "ranks", "sizes"}`` (None if unknown)."""
    try:
        from torch._C import _distributed_c10d

        # Private (torch 2.5+, no type stub): the flight recorder's ring buffer as JSON.
        dump = _distributed_c10d._dump_fr_trace_json  # type: ignore[attr-defined]
        entries = json.loads(dump(True, False)).get("entries") or []
    except Exception:  # no recorder in this build or backend: report without the collective's name
        return None
    if not entries:
        return None
    entry = max(entries, key=lambda e: e.get("record_id", 0))
    group_name, group_desc = (list(entry.get("process_group") or []) + ["?", "?"])[:2]
    ranks = {g.group_name: dist.get_process_group_ranks(g) for g in job_groups(job)}.get(group_name)
    return {
        "name": str(entry.get("profiling_name", "?")).split(":")[-1],
        "seq": entry.get("collective_seq_id") if not entry.get("is_p2p") else entry.get("p2p_seq_id"),
        "group": group_desc or group_name,
        "ranks": ranks,
        "sizes": entry.get("input_sizes"),
    }


def report_timeout(job, exc: BaseException, *, step: int, heartbeat, run_dir, timeout: float) -> tuple[str, dict]:
    """The one-line report of a collective timeout on this rank, and the ``hang`` event's fields.

    Marks this rank ``timed_out`` in its heartbeat, then waits up to ``min(timeout, 10 s)`` for the
    other ranks' heartbeats to settle before naming the ones that did not arrive.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    collective = last_collective(job)
    where = _describe_collective(collective)
    if heartbeat is not None:
        heartbeat.beat(step - 1, "timed_out", current_step=step, collective=collective)
    beats = _settled_heartbeats(run_dir, heartbeat, world, grace=min(timeout, 10.0)) if run_dir is not None else {}
    attempt = heartbeat.fixed["attempt"] if heartbeat is not None else None
    waiting = sorted(r for r, b in beats.items() if b.get("attempt") == attempt and b.get("state") == "timed_out")
    members = (collective or {}).get("ranks") or list(range(world))
    missing = [r for r in members if r not in waiting and (r != rank)]
    fields = {"step": step, "collective": collective, "waiting": waiting, "missing": missing, "timeout_s": timeout}
    head = f"rank {rank}: collective timeout in step {step}: {where} waited {timeout:g} s"
    if not beats:
        return f"{head} for a rank that never arrived (no run directory, so no heartbeats to name it)", fields
    if missing:
        said = "; ".join(f"rank {r} {_last_seen(beats.get(r), attempt)}" for r in missing[:8])
        return f"{head}; did not arrive: {said}", fields
    others = [beats[r] for r in waiting if r != rank and beats[r].get("collective")]
    mismatch = ", ".join(f"rank {b['rank']} in {_describe_collective(b.get('collective'))}" for b in others[:6])
    return (
        f"{head}; every rank of the group timed out, in different collectives ({mismatch}): a rank skipped "
        "or added a collective, so the ranks no longer agree on their order",
        fields,
    )


def _describe_collective(collective: dict[str, Any] | None) -> str:
    if not collective:
        return "a collective"
    ranks = collective.get("ranks")
    over = f" over ranks {_ranks_text(ranks)}" if ranks else ""
    return f"{collective['name']} #{collective['seq']} ({collective['group']}{over})"


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def _last_seen(beat: dict[str, Any] | None, attempt: int | None) -> str:
    if beat is None or beat.get("attempt") != attempt:
        return "(no heartbeat in this attempt: it never started, or the run directory is not shared by its node)"
    ago = time.time() - float(beat.get("time", 0))
    return (
        f"(last heartbeat {ago:.1f} s ago: {beat.get('state')}, {beat.get('step')} step(s) done, "
        f"pid {beat.get('pid')} on {beat.get('host')})"
    )


def _settled_heartbeats(run_dir, heartbeat, world: int, *, grace: float) -> dict[int, dict[str, Any]]:
    """The heartbeats once every rank of this attempt has finished (timed out, failed, ...) or ``grace`` passed."""
    attempt = heartbeat.fixed["attempt"] if heartbeat is not None else None
    deadline = time.monotonic() + grace
    while True:
        beats = read_heartbeats(run_dir)
        settled = all(
            beats.get(r, {}).get("attempt") == attempt and beats[r].get("state") in FINAL_STATES for r in range(world)
        )
        if settled or time.monotonic() >= deadline:
            return beats
        time.sleep(0.2)
