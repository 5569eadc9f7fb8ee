"""Writing a checkpoint so that it is either complete and verified, or absent.

1. every rank writes its DCP files into ``step-N.tmp`` (``FileSystemWriter(sync_files=True)``:
   each file is flushed with fsync), blocking or in the background (``dcp.async_save``, from a host
   copy that one :func:`background_stager` per run keeps and refills);
2. every rank reports success or its error (a full disk, an I/O error) to all the others;
3. only if all succeeded: rank 0 has written ``planc.json``; every rank hashes a share of the files;
   rank 0 writes ``manifest.json`` (size and SHA-256 of each), flushes the directory, renames it to
   ``step-N`` (atomic on POSIX file systems), flushes the parent, and prunes old checkpoints;
4. otherwise the partial directory is removed and every rank raises :class:`CheckpointSaveError`,
   which names each failing rank and the previous checkpoint, left untouched.

A process killed at any moment leaves at most a ``.tmp`` directory, which is never loaded.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions

from planc.rundir import manifest
from planc.runtime import faults
from planc.runtime.checkpoint import (
    FORMAT_VERSION,
    INCOMPLETE,
    METADATA_FILE,
    STEP_DIR,
    CheckpointError,
    SafeFileSystemReader,
    _barrier,
    _copy_hyperparameters,
    _distributed,
    _gather_values,
    _inner_optimizer,
    _is_writer,
    _pairs,
    _quiet_if_single_process,
    _state,
    complete_steps,
    latest_step,
    model_item_ranges,
    step_dir,
)


class CheckpointSaveError(CheckpointError):
    """Saving failed on at least one rank; raised on every rank. The partial directory is gone and
    ``previous`` (the newest complete checkpoint's step, or None) is untouched."""

    def __init__(self, step: int, errors: dict[int, str], previous: int | None):
        self.step, self.errors, self.previous = step, errors, previous
        failures = "; ".join(f"rank {rank}: {message}" for rank, message in sorted(errors.items())[:4])
        if len(errors) > 4:
            failures += f"; and {len(errors) - 4} more rank(s)"
        kept = (
            f"the previous checkpoint {STEP_DIR.format(step=previous)} is intact"
            if previous is not None
            else "there is no earlier checkpoint"
        )
        super().__init__(
            f"could not save the checkpoint of step {step} ({failures}); its partial files were removed; {kept}"
        )


def save_checkpoint(
    directory: str | Path,
    step: int,
    model_parts: Sequence[nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    lr_schedulers: Sequence[Any] = (),
    *,
    keep: int | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Save after ``step`` finished optimizer steps; collective (every rank calls it). Returns the directory.

    Raises :class:`CheckpointSaveError` on every rank when any rank failed to write its part.
    """
    return start_save(directory, step, model_parts, optimizers, lr_schedulers, keep=keep, extra=extra).finish()


def start_save(
    directory: str | Path,
    step: int,
    model_parts: Sequence[nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    lr_schedulers: Sequence[Any] = (),
    *,
    keep: int | None = None,
    extra: dict[str, Any] | None = None,
    background: bool = False,
    stager: AsyncStager | None = None,
    timeout: float | None = None,
) -> PendingSave:
    """Write the checkpoint of ``step`` into ``step-N.tmp``; :meth:`PendingSave.finish` publishes it.

    ``background``: ``dcp.async_save`` -- the state is copied to host memory and written by a thread
    (over a gloo group of its own, so its collectives never interleave with training's); training
    may go on until :meth:`PendingSave.finish`. ``stager`` (:func:`background_stager`, one per run)
    makes that copy into the host buffers of the previous save; without one, DCP allocates and
    fills a fresh copy of all the state each time. The previous background save must be finished
    first, since its thread writes from those buffers. Collective. ``timeout``: that group's
    collective timeout in seconds, the one every other group of the job has (None: gloo's default,
    30 minutes).
    """
    pairs = _pairs(model_parts, optimizers)
    for _, optimizer in pairs:
        # ZeRO updates its local optimizer's lr only inside step(); the scheduler has moved on since.
        _copy_hyperparameters(optimizer, _inner_optimizer(optimizer))
    tmp = step_dir(directory, step).with_name(STEP_DIR.format(step=step) + ".tmp")
    errors = _fresh_directory(tmp)
    _barrier()
    state, optim_values, _ = _state(pairs)
    writer = _Writer(str(tmp), sync_files=True)  # fsync every file before it counts as written
    faults.wrap_checkpoint_writer(writer, step)
    future = None
    try:
        with _quiet_if_single_process():
            if background:
                future = dcp.async_save(
                    state, storage_writer=writer, process_group=_background_group(timeout), async_stager=stager
                )
            else:
                dcp.save(state, storage_writer=writer, no_dist=not _distributed())
    except (Exception, CheckpointException) as exc:  # reported by every rank in finish(), never half-published
        errors.update(_failures(exc))
    if writer.root_cause is not None:
        errors[_rank()] = writer.root_cause
    optim_values = _gather_values(optim_values)
    if _is_writer() and not errors:
        metadata = {
            "format": FORMAT_VERSION,
            "step": step,
            "lr_schedulers": [s.state_dict() for s in lr_schedulers],
            "optimizer_values": optim_values,
            "extra": extra or {},
        }
        errors.update(_write_metadata(tmp, metadata))
    pending = PendingSave(Path(directory), step, tmp, future, errors, keep)
    pending.writer = writer
    return pending


def background_stager(device: torch.device) -> DefaultStager:
    """The host copy that background saves write from, kept for a whole run: the first save allocates
    it, every later one refills it in place (DCP's ``StateDictStager`` keys its buffers by the
    storage of each tensor, which training updates in place).

    Without it, ``dcp.async_save`` stages through ``FileSystemWriter.stage`` (torch 2.13
    ``staging.py``, ``BlockingAsyncStager`` with ``cache_staged_state_dict=False``): a fresh
    pageable host copy of the model and optimizer state at every save, ~16 GB per rank for Llama 3
    8B under FSDP over 8 GPUs, page-faulted by 8 ranks at once while training waits. On CUDA the
    buffers are pinned and filled by non-blocking copies (then synchronised, so the snapshot is of
    this step); pinning needs CUDA, so on CPU they are plain memory. Staging stays synchronous:
    training must not change a tensor before its copy is taken. Call ``close()`` at the end of the run.
    """
    cuda = device.type == "cuda"
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=cuda,
            use_shared_memory=False,  # the writer is a thread of this process
            use_async_staging=False,
            use_non_blocking_copy=cuda,
        )
    )


def _fresh_directory(tmp: Path) -> dict[int, str]:
    """Rank 0 empties or creates ``tmp`` (a crashed attempt at this step may have left one); its error, if any."""
    if not _is_writer():
        return {}
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    except OSError as err:
        return {_rank(): f"cannot create {tmp}: {err}"}
    return {}


def _write_metadata(tmp: Path, metadata: dict[str, Any]) -> dict[int, str]:
    """Rank 0 writes ``planc.json`` and flushes it; its error, if any."""
    try:
        text = json.dumps(metadata, indent=2)
    except TypeError as err:  # a bug in the caller, not a disk problem
        raise CheckpointError(f"checkpoint metadata must be JSON (scheduler state or extra): {err}") from None
    try:
        with open(tmp / METADATA_FILE, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        return {_rank(): f"writing {METADATA_FILE}: {err}"}
    return {}


class PendingSave:
    """A checkpoint being written into ``step-N.tmp``; :meth:`finish` waits, checks and publishes it."""

    def __init__(self, directory: Path, step: int, tmp: Path, future, errors: dict[int, str], keep: int | None):
        self.directory, self.step, self.tmp, self.keep = directory, step, tmp, keep
        self._future, self._errors = future, errors
        self.writer: _Writer | None = None
        self.began = 0.0  # perf_counter() when the save started (set by the caller, for its report)

    def written(self) -> bool:
        """True when this rank's files are written (always, for a blocking save)."""
        return self._future is None or self._future.done()

    def finish(self) -> Path:
        """Collective: once every rank's part is written, rank 0 writes the manifest and renames the
        directory into place, then prunes. Raises :class:`CheckpointSaveError` on every rank if any failed."""
        errors = dict(self._errors)
        if self._future is not None and not errors:
            try:
                self._future.result()
            except (Exception, CheckpointException) as exc:
                errors.update(_failures(exc))
                if self.writer is not None and self.writer.root_cause is not None:
                    errors[_rank()] = self.writer.root_cause
        errors = _merged(errors)
        files: dict[str, Any] = {}
        if not errors:  # every rank's files are on disk: hash a share of them each
            local: dict[int, str] = {}
            try:
                names = manifest.checkpoint_files(self.tmp)
                items = model_item_ranges(SafeFileSystemReader(self.tmp).read_metadata())
                files = manifest.describe(self.tmp, manifest.share(names, _rank(), _world()), items)
            except (OSError, CheckpointError) as err:
                local[_rank()] = f"reading back {self.tmp.name}: {err}"
            files, errors = _merged_files(files, local)
        outcome = None
        if _is_writer():
            if errors:
                shutil.rmtree(self.tmp, ignore_errors=True)
            else:
                outcome = self._publish(files)
        outcome = _from_writer(outcome)
        if outcome:
            errors = {0: outcome}
        if errors:
            raise CheckpointSaveError(self.step, errors, latest_step(self.directory))
        return step_dir(self.directory, self.step)

    def _publish(self, files: dict[str, Any]) -> str | None:
        """Rank 0: manifest, flush, atomic rename, prune. Returns an error message, or None."""
        final = step_dir(self.directory, self.step)
        try:
            manifest.write_manifest(self.tmp, self.step, files)
            if final.exists():
                shutil.rmtree(final)
            os.replace(self.tmp, final)
            manifest.fsync_directory(self.directory)  # the rename itself survives a power loss
        except OSError as err:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return f"publishing {final.name}: {err}"
        _prune(self.directory, self.keep)
        return None


class _Writer(FileSystemWriter):
    """DCP's file writer, keeping this rank's own write error in full: the copy DCP gathers to the other
    ranks is pickled, which drops the OSError behind the serializer's complaint."""

    root_cause: str | None = None

    def write_data(self, plan, planner):
        try:
            future = super().write_data(plan, planner)
            future.wait()
        except BaseException as exc:
            self.root_cause = _one_line(exc)
            raise
        return future


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _world() -> int:
    return dist.get_world_size() if _distributed() else 1


def _failures(exc: BaseException) -> dict[int, str]:
    """Per-rank messages of a failed DCP save (DCP gathers every rank's exception into one)."""
    if isinstance(exc, CheckpointException) and getattr(exc, "failures", None):
        return {int(rank): _one_line(err) for rank, err in exc.failures.items()}
    return {_rank(): _one_line(exc)}


def _one_line(exc: Any) -> str:
    """The root cause in one line: an OSError (full disk, I/O error) behind the serializer's own complaint."""
    if isinstance(exc, tuple):  # DCP keeps (exception, traceback) pairs
        exc = exc[0]
    seen, cause = set(), exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError):
            exc = cause
            break
        cause = cause.__cause__ or cause.__context__
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:300]


def _merged(errors: dict[int, str]) -> dict[int, str]:
    """Every rank's errors, on every rank; what a rank says about itself wins over what others heard."""
    if not _distributed():
        return errors
    gathered: list[Any] = [None] * _world()
    dist.all_gather_object(gathered, errors)
    merged: dict[int, str] = {}
    for part in gathered:
        for rank, message in (part or {}).items():
            merged.setdefault(rank, message)
    for rank, part in enumerate(gathered):
        if part and rank in part:
            merged[rank] = part[rank]
    return merged


def _merged_files(files: dict[str, Any], errors: dict[int, str]) -> tuple[dict[str, Any], dict[int, str]]:
    if not _distributed():
        return files, errors
    gathered: list[Any] = [None] * _world()
    dist.all_gather_object(gathered, (files, errors))
    all_files: dict[str, Any] = {}
    all_errors: dict[int, str] = {}
    for part_files, part_errors in gathered:
        all_files.update(part_files)
        all_errors.update(part_errors)
    return all_files, all_errors


def _from_writer(value: Any) -> Any:
    """Rank 0's ``value`` on every rank."""
    if not _distributed():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


_BACKGROUND_GROUP: list[Any] = []


def _background_group(timeout: float | None = None):
    """A gloo group for ``dcp.async_save``'s thread (created once, collectively, at the first background
    save), with the job's collective ``timeout`` (seconds; None: gloo's default)."""
    if not _distributed():
        return None
    limit = timedelta(seconds=timeout) if timeout is not None else None
    if not _BACKGROUND_GROUP:
        _BACKGROUND_GROUP.append(dist.new_group(backend="gloo", timeout=limit))
    elif limit is not None:
        _BACKGROUND_GROUP[0].set_timeout(limit)
    return _BACKGROUND_GROUP[0]


def _prune(directory: Path, keep: int | None) -> None:
    """Delete all but the newest ``keep`` complete checkpoints, and every abandoned ``.tmp``."""
    for entry in directory.iterdir():
        if INCOMPLETE.match(entry.name):
            shutil.rmtree(entry, ignore_errors=True)
    if keep is not None:
        for old in complete_steps(directory)[:-keep] if keep > 0 else []:
            shutil.rmtree(step_dir(directory, old), ignore_errors=True)
