"""``planc export``: a run's DCP checkpoint as Hugging Face safetensors, or as one torch state dict.

The checkpoint may have been written by any layout (FSDP/TP shards, pipeline stages): DCP's
loader assembles each requested full tensor from whatever chunks hold it (the same resharding
that lets a run resume at another layout), in one process, no process group needed. The export
runs **one output shard at a time**: it loads the planc tensors that feed the Hugging Face tensors
of that shard, converts them (:mod:`planc.weights.hf_names`), writes the shard with
``safetensors`` and frees them -- so memory stays near one shard (``max_shard_bytes``, 5 GB by
default, as ``save_pretrained``) whatever the model's size, and the optimizer state is never read.

Output (Hugging Face): ``config.json`` and ``model.safetensors``, or ``model-0000i-of-0000n.safetensors``
shards plus ``model.safetensors.index.json`` -- what ``save_pretrained`` writes, so
``AutoModelForCausalLM.from_pretrained(DIR)`` loads it. With ``--format torch``: ``model.pt``, the
full state dict of planc's own model (``build_model(spec).load_state_dict``; padding rows kept),
and ``plan.json``. Both load without pickled code: safetensors holds only tensors, and
``model.pt`` holds only tensors, so ``torch.load(..., weights_only=True)`` reads it.

The checkpoint is checked against its ``manifest.json`` as a resume checks it, but reading only
what the export needs (:mod:`planc.weights.checked_read`): every file's size and the small files'
SHA-256 before loading, and the weights' SHA-256 (``model_sha256``) from the very bytes DCP loads,
before the export is published. A damaged checkpoint is refused, not exported as a model that
silently differs; the optimizer state is not read.

The directory is written under a temporary name beside ``to`` and renamed when complete, so an
interrupted export leaves nothing that looks finished.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException

from planc.errors import PlanError
from planc.fileio import publish_modes
from planc.runtime.transformer import canonical_name
from planc.spec import ModelSpec, Plan, strict_json
from planc.weights.checked_read import WeightsCheck
from planc.weights.hf_configs import config_for
from planc.weights.hf_names import UnsupportedFamily, family_for_spec, hf_shapes, tensor_sources

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Exported:
    """What an export wrote: the directory, its files, the checkpoint step and the tensors' bytes."""

    directory: Path
    files: tuple[str, ...]
    step: int
    total_bytes: int


def export_run(
    run_dir: Path,
    to: Path,
    *,
    step: int | None = None,
    fmt: str = "hf",
    dtype: str = "fp32",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    overwrite: bool = False,
) -> Exported:
    """Export run ``run_dir``'s checkpoint at ``step`` (default: the newest) to the directory ``to``."""
    plan = _read_plan(run_dir)
    checkpoint, step = _checkpoint_dir(run_dir, plan, step)
    check = WeightsCheck(checkpoint)
    _refuse_damaged(run_dir, checkpoint, step, check.upfront_problems())
    stored = _stored_model_tensors(checkpoint)
    if fmt == "hf":
        try:
            family = family_for_spec(plan.model)
        except UnsupportedFamily as exc:
            raise PlanError(f"cannot export {run_dir} as Hugging Face safetensors: {exc}") from None
    _check_destination(to, overwrite)
    staging = Path(tempfile.mkdtemp(prefix=f".{to.name}.", suffix=".tmp", dir=to.parent))
    try:
        try:
            if fmt == "hf":
                files, total = _write_hf(check, stored, plan.model, family, staging, DTYPES[dtype], max_shard_bytes)
                _write_json(staging / "config.json", config_for(plan.model, family, dtype))
            else:
                files, total = _write_torch(check, stored, plan, staging, DTYPES[dtype])
        except (Exception, CheckpointException):  # DCP's failure is a BaseException
            _refuse_damaged(run_dir, checkpoint, step, _problems_after_failure(check))  # bad bytes may fail DCP first
            raise
        _refuse_damaged(run_dir, checkpoint, step, check.problems())  # the weights written are the manifest's
        publish_modes(staging)  # mkdtemp's 0700, which safetensors' 0600 files would keep: readable as the umask says
        if to.exists():
            shutil.rmtree(to)
        staging.rename(to)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Exported(to, tuple(sorted(files)), step, total)


# -- the run and its checkpoint --------------------------------------------------------------------


def _read_plan(run_dir: Path) -> Plan:
    if not run_dir.is_dir():
        raise PlanError(f"run directory not found: {run_dir}", hint="give the --out directory of a `planc run`")
    path = run_dir / "plan.json"
    try:
        record = strict_json.loads(path.read_text(encoding="utf-8"))
        # The plan as the run used it; not checked again (its init weights need not exist any more).
        return Plan.model_validate(record["plan"])
    except FileNotFoundError:
        raise PlanError(f"{run_dir} is not a planc run directory (no plan.json)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PlanError(f"cannot read the plan of {path}: {str(exc).splitlines()[0]}") from None


def _checkpoint_dir(run_dir: Path, plan: Plan, step: int | None) -> tuple[Path, int]:
    from planc.runtime.checkpoint import complete_steps, step_dir

    if plan.checkpoint is None:
        raise PlanError(
            f"{run_dir} has no checkpoints: its plan has no checkpoint block",
            hint="add e.g. checkpoint { every = 100 } to the plan and train again",
        )
    directory = run_dir / plan.checkpoint.dir
    steps = complete_steps(directory)
    if not steps:
        raise PlanError(f"no complete checkpoint in {directory}", hint="train until the first checkpoint is saved")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        listed = ", ".join(map(str, steps[-10:]))
        raise PlanError(f"no checkpoint of step {step} in {directory}", hint=f"checkpoints exist for steps {listed}")
    return step_dir(directory, step), step


def _refuse_damaged(run_dir: Path, checkpoint: Path, step: int, problems: list[str]) -> None:
    """Refuse a checkpoint that fails its manifest (a changed byte, a truncated or missing file).

    DCP would load a flipped byte without complaint, and the export would be a model whose weights
    differ from the trained ones; resume checks the same manifest before it loads
    (:mod:`planc.runtime.resume`). The hint names the newest older checkpoint.
    """
    from planc.runtime.checkpoint import complete_steps

    if not problems:
        return
    older = [s for s in complete_steps(checkpoint.parent) if s < step]
    verify = f"`planc doctor --verify {run_dir}` checks every checkpoint"
    if older:
        hint = f"export the newest older checkpoint instead: --step {older[-1]}; {verify}"
    else:
        hint = f"it is the run's only complete checkpoint, so there is no older one to export; {verify}"
    raise PlanError(f"the checkpoint {checkpoint} is damaged: {'; '.join(problems)}", hint=hint)


def _problems_after_failure(check: WeightsCheck) -> list[str]:
    """What the manifest finds once a load has failed: the failure itself when it cannot tell."""
    from planc.runtime.checkpoint import CheckpointError

    try:
        return check.problems()
    except (OSError, CheckpointError):
        return []


def _stored_model_tensors(checkpoint: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """planc parameter name -> (full shape, dtype) of every model tensor in the DCP checkpoint."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from planc.runtime.checkpoint import CheckpointError, SafeFileSystemReader

    try:
        metadata = SafeFileSystemReader(checkpoint).read_metadata()
    except (CheckpointError, OSError) as exc:
        raise PlanError(f"cannot read the checkpoint {checkpoint}: {exc}") from None
    return {
        key.removeprefix("model."): (tuple(entry.size), entry.properties.dtype)
        for key, entry in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(entry, TensorStorageMetadata)
    }


def _load(check: WeightsCheck, stored: dict, names: list[str]) -> dict[str, torch.Tensor]:
    """Full tensors of the planc parameters ``names`` (DCP reassembles them from every shard),
    through ``check``'s reader, which hashes the bytes it reads."""
    import torch.distributed.checkpoint as dcp

    checkpoint = check.checkpoint
    missing = [n for n in names if n not in stored]
    if missing:
        raise PlanError(f"the checkpoint {checkpoint} has no tensor {missing[0]!r}; it is not this plan's model")
    state = {"model": {n: torch.empty(stored[n][0], dtype=stored[n][1]) for n in names}}
    with warnings.catch_warnings():  # DCP warns that it runs without a process group: that is the intent
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(state, storage_reader=check.reader(), no_dist=True)
    return state["model"]


# -- writers ---------------------------------------------------------------------------------------


def _write_hf(check, stored, spec: ModelSpec, family, out: Path, dtype, max_shard_bytes: int):
    """Safetensors shards of at most ``max_shard_bytes`` (a larger single tensor gets its own shard)."""
    from safetensors.torch import save_file

    shapes = hf_shapes(spec, family)
    feeds: dict[str, list[tuple[str, object]]] = {name: [] for name in shapes}
    for planc_name, source in tensor_sources(spec, family).items():
        if planc_name == "output.weight" and spec.tie_embeddings:
            continue  # the embedding, already fed by tok_embeddings.weight
        feeds[source.hf_name].append((canonical_name(planc_name, spec), source))
    itemsize = torch.tensor([], dtype=dtype).element_size()
    shards = _group(shapes, itemsize, max_shard_bytes)
    files, weight_map, total = [], {}, 0
    for number, shard in enumerate(shards, start=1):
        planc_tensors = _load(check, stored, sorted({n for hf in shard for n, _ in feeds[hf]}))
        tensors = {hf: _hf_tensor(shapes[hf], feeds[hf], planc_tensors).to(dtype).contiguous() for hf in shard}
        name = "model.safetensors" if len(shards) == 1 else f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        files.append(name)
        weight_map.update(dict.fromkeys(shard, name))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        del planc_tensors, tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        _write_json(out / "model.safetensors.index.json", index)
        files.append("model.safetensors.index.json")
    return files + ["config.json"], total


def _group(shapes: dict[str, tuple[int, ...]], itemsize: int, limit: int) -> list[list[str]]:
    """Tensors in model order, cut into consecutive groups of at most ``limit`` bytes."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = itemsize * _numel(shape)
        if groups[-1] and size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count


def _hf_tensor(shape, feeds, planc_tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """One Hugging Face tensor, put together from the planc tensors that feed it (zeros elsewhere:
    a bias planc's model does not have computes as a zero bias)."""
    out = torch.zeros(shape, dtype=torch.float32)
    for planc_name, source in feeds:
        value = planc_tensors[planc_name].to(torch.float32)
        rows = source.rows.hf_rows(0, value.shape[0])
        keep = torch.tensor([i for i, r in enumerate(rows) if r is not None], dtype=torch.long)
        index = torch.tensor([r for r in rows if r is not None], dtype=torch.long)
        if source.transpose:  # Conv1D [in, out]: planc's rows are its columns
            out[:, index] = value.index_select(0, keep).t()
        else:
            out[index] = value.index_select(0, keep)
    return out


def _write_torch(check, stored, plan: Plan, out: Path, dtype):
    """``model.pt``: planc's full state dict (a tied output shares the embedding's storage) and ``plan.json``."""
    tensors = _load(check, stored, sorted(stored))
    state = {name: t.to(dtype) for name, t in tensors.items()}
    if plan.model.tie_embeddings:  # one tensor, as in the model (DCP stores the tied output under both names)
        state["output.weight"] = state["tok_embeddings.weight"]
    torch.save(state, out / "model.pt")
    (out / "plan.json").write_text(plan.to_json() + "\n", encoding="utf-8")
    distinct = {t.untyped_storage().data_ptr(): t for t in state.values()}.values()  # a tied output once
    total = sum(t.numel() * t.element_size() for t in distinct)
    return ["model.pt", "plan.json"], total


def _check_destination(to: Path, overwrite: bool) -> None:
    if to.exists() and not to.is_dir():
        raise PlanError(f"--to {to} is a file", hint="give a directory to write the export into")
    if to.is_dir() and any(to.iterdir()) and not overwrite:
        raise PlanError(f"--to {to} exists and is not empty", hint="choose a new directory, or pass --overwrite")
    if not to.parent.is_dir():  # --to is "created", parents too (as `mkdir -p`; the walkthrough writes exported/tiny)
        try:
            to.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PlanError(
                f"cannot write {to}: cannot create the directory {to.parent} ({exc.strerror})",
                hint="give a --to under a directory you can write",
            ) from exc


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
