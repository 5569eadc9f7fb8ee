"""Where a run (re)starts: the newest checkpoint that checks out, else the checkpoint another run left.

Order of preference, decided the same on every rank:

1. the run's own complete checkpoints, newest first (when ``checkpoint.resume`` is on). Each is
   checked against its manifest before it is loaded -- sizes by every rank, SHA-256 split between
   the ranks -- and one that fails (a truncated file, a missing shard, a changed byte) is reported,
   renamed ``step-N.corrupt`` and skipped for the next older one;
2. ``resume.json``: the checkpoint of another run that `planc run --resume-from` started this one
   from (another layout or device count; DCP reshards it);
3. step 0.

What is loaded: model weights and optimizer state, by parameter name. What is *not* taken from the
checkpoint: the hyperparameters and the learning-rate schedule, which come from the plan being run,
evaluated at the checkpoint's step (the data position is the step as well), so a run continued
under an edited plan follows the edited plan from there on, and an unchanged plan continues exactly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from planc.rundir.carry_over import read_resume_source
from planc.rundir.checkpoints import complete_steps, integrity_problems, read_metadata, step_dir
from planc.rundir.manifest import read_manifest, share
from planc.runtime.checkpoint import CheckpointError, _copy_hyperparameters, load_checkpoint
from planc.runtime.local_shards import dtensor_parameters


@dataclass(frozen=True)
class ResumePoint:
    step: int
    path: Path
    from_other_run: bool


def resume(job, checkpoint_dir: Path | None, run_dir: Path | None, report) -> ResumePoint | None:
    """Load the checkpoint to start from (see the module docstring); None: start at step 0.

    ``report(event, message, **fields)`` is called on rank 0 for a skipped checkpoint. Collective.
    """
    plan = job.plan
    if checkpoint_dir is not None and plan.checkpoint is not None and plan.checkpoint.resume:
        for step in reversed(_agreed_steps(checkpoint_dir)):
            path = step_dir(checkpoint_dir, step)
            problems = _problems(path)
            if not problems:
                _load(job, checkpoint_dir, step)
                return ResumePoint(step, path, from_other_run=False)
            if _rank() == 0:
                corrupt = path.with_name(path.name + ".corrupt")
                try:
                    os.replace(path, corrupt)
                except OSError:
                    corrupt = path
                report(
                    "checkpoint_skipped",
                    f"checkpoint {path.name} is damaged, skipped (kept as {corrupt.name}): {'; '.join(problems)}",
                    step=step,
                    path=str(corrupt),
                    problems=problems,
                )
            _barrier()
    source = read_resume_source(run_dir)
    if source is None:
        return None
    path = Path(source["checkpoint"])
    problems = _problems(path)
    if problems:
        raise CheckpointError(f"cannot continue from {path}: {'; '.join(problems)}")
    _load(job, path.parent, read_metadata(path)["step"])
    return ResumePoint(int(source["step"]), path, from_other_run=True)


def _load(job, directory: Path, step: int) -> None:
    """Load weights and optimizer state; keep the plan's hyperparameters, with its schedule at ``step``."""
    planned = _hyperparameters(job)
    with dtensor_parameters(job):
        load_checkpoint(directory, job.model_parts, job.optimizers, job.lr_schedulers, step=step)
    _restore_hyperparameters(job, planned)


def _hyperparameters(job) -> list[tuple[list[dict[str, Any]], list[float]]]:
    return [
        ([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups], list(sched.base_lrs))
        for opt, sched in zip(job.optimizers, job.lr_schedulers)
    ]


def _restore_hyperparameters(job, planned) -> None:
    """The plan's values in every parameter group, and the plan's learning rate at the loaded step."""
    for opt, sched, (groups, base_lrs) in zip(job.optimizers, job.lr_schedulers, planned):
        for group, values in zip(opt.param_groups, groups):
            group.update(values)
        sched.base_lrs = base_lrs
        lrs = [base * fn(sched.last_epoch) for base, fn in zip(base_lrs, sched.lr_lambdas)]
        for group, lr in zip(opt.param_groups, lrs):
            group["lr"] = lr
        sched._last_lr = lrs
        inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer's local optimizer
        if inner is not opt:
            _copy_hyperparameters(opt, inner)


def _problems(path: Path) -> list[str]:
    """Integrity problems of a checkpoint, found together by every rank (each hashes a share)."""
    manifest = read_manifest(path) or {"files": {}}
    mine = share(manifest["files"], _rank(), _world())
    problems = integrity_problems(path, hash_names=mine)
    if _world() > 1:
        gathered: list[Any] = [None] * _world()
        dist.all_gather_object(gathered, problems)
        problems = sorted({p for part in gathered for p in (part or [])})
    return problems


def _agreed_steps(directory: Path) -> list[int]:
    """Rank 0's list of complete checkpoints, on every rank (so all ranks walk the same list)."""
    steps = complete_steps(directory) if _rank() == 0 else None
    if _world() > 1:
        box = [steps]
        dist.broadcast_object_list(box, src=0)
        steps = box[0]
    return steps or []


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _barrier() -> None:
    if _world() > 1:
        dist.barrier()
