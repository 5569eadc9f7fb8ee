"""Distributed checkpoints with ``torch.distributed.checkpoint`` (DCP), never left half-written.

What a checkpoint holds: the model state of every model part and the state of their optimizers,
both keyed by the parameters' names in the *full* model (``get_state_dict`` canonical FQNs, and
``flatten_optimizer_state_dict=True`` for the optimizer), so a checkpoint written at one layout --
FSDP/TP shards, pipeline stages -- loads at another wherever DCP can reshard (it can between any
DTensor/plain-tensor placements; the FQNs make pipeline splits irrelevant). Beside the DCP files,
``planc.json`` (rank 0) holds the step, the learning-rate schedulers' states and the caller's extra
JSON data. The data position is the step itself: every data source is a function of the step.

Layout on disk (see :mod:`planc.rundir.checkpoints`)::

    <dir>/step-00000100/       a complete checkpoint (after 100 optimizer steps)
    <dir>/step-00000200.tmp/   being written, or abandoned by a crash: never loaded

Writing goes to ``step-N.tmp`` (DCP flushes every file with fsync). Then every rank reports
whether its part succeeded; only when all did does rank 0 write ``planc.json`` and
``manifest.json`` (size and SHA-256 of every file, hashed by all ranks in parallel), flush the
directory, and rename it to ``step-N`` -- a rename within a directory is atomic on POSIX file
systems. A failure on any rank (a full disk, an I/O error) raises :class:`CheckpointSaveError` on
every rank, removes the partial directory and leaves the previous checkpoints untouched. After a
save, rank 0 deletes all but the newest ``keep`` and any stale ``.tmp`` directories. All ranks must
see the same directory (a shared file system when there are several nodes).

Safe to read: DCP would load any non-tensor value with ``torch.load(weights_only=False)``, so only
tensors go into the DCP files; the optimizer's per-parameter hyperparameters (lr, betas, ...) are
gathered to rank 0 and stored in ``planc.json``. DCP's own ``.metadata`` file is a pickle; it is
read with an unpickler that admits only DCP's metadata classes, torch sizes/dtypes/layouts and
paths (:class:`SafeFileSystemReader`), so a checkpoint directory cannot run code.

Model parts and optimizers come in parallel lists, one optimizer per model part (as torchtitan's
``OptimizersContainer``), because DCP maps optimizer state to names through the part that owns the
parameters. A ``ZeroRedundancyOptimizer`` is saved through its local optimizer: each rank writes the
state of the parameters it owns.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from planc.rundir.checkpoints import (  # noqa: F401  (re-exported: the runtime's checkpoint API)
    FORMAT_VERSION,
    INCOMPLETE,
    METADATA_FILE,
    READABLE_FORMATS,
    STEP_DIR,
    complete_steps,
    latest_step,
    step_dir,
)

#: Optimizer state keyed by parameter name, independent of the pipeline split.
OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read (the message says which and why)."""


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _quiet_if_single_process():
    """DCP warns on every single-process save/load that it assumes one process; that is the intent."""
    with warnings.catch_warnings():
        if not _distributed():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _is_writer() -> bool:
    return not _distributed() or dist.get_rank() == 0


@contextlib.contextmanager
def _gradients_set_aside(optimizer: torch.optim.Optimizer):
    """Hide the parameters' gradients from DCP while it names an optimizer's states.

    An optimizer that has not stepped has no states to name, so ``get_optimizer_state_dict``
    first creates them with a zero-gradient step -- but only when no parameter has a gradient
    (``torch.distributed.checkpoint.state_dict._init_optim_state``), and then sets every gradient
    to None. planc's DDP keeps its gradients as zeroed views into its buckets, never None
    (:func:`planc.strategies.ddp.runtime.give_zero_gradients`): DCP skipped the states, and a
    resumed run silently restarted Adam's moments (losses left the reference at the first step
    after a restart: tests/reliability). Set aside, the states are made and loaded; the bucket
    views are put back after."""
    if optimizer.state:
        yield
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    kept = [p.grad for p in params]
    for param in params:
        param.grad = None
    try:
        yield
    finally:
        for param, grad in zip(params, kept):
            param.grad = grad


def _inner_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer whose ``state`` holds this rank's tensors (ZeRO keeps only its partition's)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer


def _copy_hyperparameters(source: torch.optim.Optimizer, target: torch.optim.Optimizer) -> None:
    """Copy lr, betas, ... group by group (ZeRO's outer groups mirror its local optimizer's)."""
    if source is target:
        return
    if len(source.param_groups) != len(target.param_groups):
        raise CheckpointError(
            f"ZeRO optimizer has {len(source.param_groups)} parameter groups but its local optimizer "
            f"{len(target.param_groups)}; cannot carry hyperparameters between them"
        )
    for src, dst in zip(source.param_groups, target.param_groups):
        dst.update({key: value for key, value in src.items() if key != "params"})


def _pairs(model_parts: Sequence[nn.Module], optimizers: Sequence[torch.optim.Optimizer]):
    if isinstance(model_parts, nn.Module):
        model_parts = [model_parts]
    if isinstance(optimizers, torch.optim.Optimizer):
        optimizers = [optimizers]
    if len(optimizers) != len(model_parts):
        raise CheckpointError(
            f"{len(model_parts)} model parts but {len(optimizers)} optimizers: build one optimizer per model "
            "part, so that each optimizer's state can be named by the parameters of its part"
        )
    return list(zip(model_parts, optimizers))


def _state(pairs) -> tuple[dict[str, Any], dict[str, Any], list[tuple[set[str], set[str]]]]:
    """The tensors to save/load, the optimizers' non-tensor values, and which keys each part owns.

    Tensors: ``{"model": {fqn: tensor}, "optim": {"state.<fqn>.exp_avg": tensor, ...}}``, merged over
    the parts. Non-tensors: flattened optimizer entries such as ``"param_groups.<fqn>.lr"``.
    """
    model_state: dict[str, Any] = {}
    optim_tensors: dict[str, Any] = {}
    optim_values: dict[str, Any] = {}
    owned = []
    for part, optimizer in pairs:
        part_model = get_model_state_dict(part)
        with _gradients_set_aside(_inner_optimizer(optimizer)):
            part_optim = get_optimizer_state_dict(part, _inner_optimizer(optimizer), options=OPTIM_OPTIONS)
        clash = (model_state.keys() & part_model.keys()) | (
            (optim_tensors.keys() | optim_values.keys()) & part_optim.keys()
        )
        if clash:
            raise CheckpointError(
                f"model parts share state {sorted(clash)[:3]}; every part must own distinct parameters"
            )
        for key, value in part_model.items():
            if not isinstance(value, torch.Tensor):
                raise CheckpointError(f"model state {key!r} is a {type(value).__name__}, not a tensor")
        model_state.update(part_model)
        for key, entry in part_optim.items():
            (optim_tensors if isinstance(entry, torch.Tensor) else optim_values)[key] = entry
        owned.append((set(part_model), set(part_optim)))
    return {"model": model_state, "optim": optim_tensors}, optim_values, owned


def _gather_values(values: dict[str, Any]) -> dict[str, Any]:
    """Every rank's optimizer values, merged (pipeline stages and ZeRO partitions own different keys)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return dict(values)
    gathered: list[dict[str, Any] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, values)
    merged: dict[str, Any] = {}
    for part in gathered:
        merged.update(part or {})
    return merged


def _restore_value(saved: Any, current: Any) -> Any:
    """A JSON value back in the type the optimizer uses (JSON turns tuples such as betas into lists)."""
    return tuple(saved) if isinstance(current, tuple) and isinstance(saved, list) else saved


class _MetadataUnpickler(pickle.Unpickler):
    """Admits only what DCP's ``.metadata`` is made of; anything else is refused, never constructed."""

    MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
    GLOBALS = {
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if module in self.MODULES:
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        elif (module, name) in self.GLOBALS:
            return super().find_class(module, name)
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"checkpoint metadata refers to {module}.{name}, which a DCP checkpoint never holds"
        )


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with :class:`_MetadataUnpickler` for the ``.metadata`` file."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as metadata_file:
            try:
                metadata = _MetadataUnpickler(metadata_file).load()
            except pickle.UnpicklingError as err:
                raise CheckpointError(f"{self.path}: refusing to read .metadata: {err}") from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{self.path}: .metadata holds a {type(metadata).__name__}, not DCP Metadata")
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def model_item_ranges(metadata: Metadata) -> dict[str, list[tuple[int, int]]]:
    """Every DCP data file -> the (offset, length) of each model item it holds (the ``model.*``
    tensors' chunks; optimizer state left out, so a file of optimizer state alone has none), from
    the checkpoint's ``.metadata``: what the manifest's ``model_sha256`` covers
    (:mod:`planc.rundir.manifest`)."""
    ranges: dict[str, set[tuple[int, int]]] = {}
    for index, info in (metadata.storage_data or {}).items():
        spans = ranges.setdefault(info.relative_path, set())
        if index.fqn.startswith("model."):
            spans.add((info.offset, info.length))
    return {name: sorted(spans) for name, spans in ranges.items()}


def load_checkpoint(
    directory: str | Path,
    model_parts: Sequence[nn.Module],
    optimizers: Sequence[torch.optim.Optimizer],
    lr_schedulers: Sequence[Any] = (),
    *,
    step: int | None = None,
) -> dict[str, Any] | None:
    """Load the newest complete checkpoint (or ``step``) into the parts, optimizers and schedulers.

    Collective. Returns the metadata (``step``, ``extra``), or None when there is no complete checkpoint.
    """
    pairs = _pairs(model_parts, optimizers)
    if step is None:
        step = latest_step(directory)
        if step is None:
            return None
    path = step_dir(directory, step)
    if not (path / METADATA_FILE).is_file():
        raise CheckpointError(f"no complete checkpoint at {path}")
    with open(path / METADATA_FILE, encoding="utf-8") as f:
        metadata = json.load(f)
    if metadata.get("format") not in READABLE_FORMATS:
        raise CheckpointError(
            f"{path}: checkpoint format {metadata.get('format')!r}, this planc reads "
            + ", ".join(map(str, READABLE_FORMATS))
        )
    if len(metadata["lr_schedulers"]) != len(lr_schedulers):
        raise CheckpointError(
            f"{path} holds {len(metadata['lr_schedulers'])} learning-rate scheduler states, "
            f"but {len(lr_schedulers)} schedulers were given"
        )
    state, optim_values, owned = _state(pairs)
    # Fills the tensors in place, resharding between layouts as needed.
    reader = SafeFileSystemReader(path)
    reader.read_metadata()  # refuses a tampered .metadata here, with a plain CheckpointError
    with _quiet_if_single_process():
        dcp.load(state, storage_reader=reader, no_dist=not _distributed())
    saved_values = metadata.get("optimizer_values", {})
    for key, current in optim_values.items():
        if key in saved_values:
            optim_values[key] = _restore_value(saved_values[key], current)
    for (part, optimizer), (model_keys, optim_keys) in zip(pairs, owned):
        set_model_state_dict(part, {k: state["model"][k] for k in model_keys})
        optim_state = {k: state["optim"][k] if k in state["optim"] else optim_values[k] for k in optim_keys}
        set_optimizer_state_dict(part, _inner_optimizer(optimizer), optim_state, options=OPTIM_OPTIONS)
        _copy_hyperparameters(_inner_optimizer(optimizer), optimizer)
    for scheduler, scheduler_state in zip(lr_schedulers, metadata["lr_schedulers"]):
        scheduler.load_state_dict(_fit_scheduler_state(scheduler_state, scheduler.state_dict(), path))
    return metadata


def _fit_scheduler_state(saved: dict[str, Any], current: dict[str, Any], path: Path) -> dict[str, Any]:
    """A saved scheduler state for as many parameter groups as the optimizer has now.

    The number of groups depends on the layout (DTensor and plain parameters are grouped apart), while
    planc gives every group the same schedule, so a per-group list whose entries are all equal maps
    onto any number of groups.
    """
    fitted = dict(saved)
    for key, value in saved.items():
        now = current.get(key)
        if isinstance(value, list) and isinstance(now, list) and len(value) != len(now):
            if value and all(v == value[0] for v in value):
                fitted[key] = [value[0]] * len(now)
            else:
                raise CheckpointError(
                    f"{path}: the learning-rate scheduler's {key!r} differs between its {len(value)} parameter "
                    f"groups, so it cannot be mapped onto this optimizer's {len(now)} groups"
                )
    return fitted


__all__ = [
    "CheckpointError",
    "SafeFileSystemReader",
    "complete_steps",
    "latest_step",
    "load_checkpoint",
    "step_dir",
]
