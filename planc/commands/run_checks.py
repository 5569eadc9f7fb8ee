"""What `planc run` checks in a run directory before it launches: never mix two runs, never relaunch a finished one.

* a run directory that **finished** the requested steps is reported as finished, not relaunched;
* one that holds logged steps but **no checkpoint** to resume from is refused (starting again would
  put a second step 1 into metrics.jsonl) unless ``--fresh`` discards it;
* one trained under **another model or optimizer** is refused: its checkpoints cannot carry over;
  other changes to the plan (the layout, the learning rate, ...) are listed and accepted;
* ``--resume-from RUN`` starts a new run directory from another run's newest good checkpoint,
  under the same checks (see :mod:`planc.rundir.carry_over`).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from planc.errors import PlanError
from planc.rundir.carry_over import RESUME_FILE, compare_plans, write_resume_source
from planc.rundir.checkpoints import integrity_problems, list_checkpoints, read_metadata
from planc.rundir.events import EVENTS_FILE
from planc.rundir.heartbeats import HEARTBEAT_DIR
from planc.rundir.metrics_file import DISCARDED_FILE, METRICS_FILE
from planc.rundir.state import RunState, inspect_run


def check_existing_run(state: RunState, plan: dict, *, target: int, plan_file: str, fresh: bool) -> str | None:
    """None when the launch may go ahead; a sentence when the run is already finished (nothing to do).

    Raises PlanError for a run that cannot continue as asked. ``plan``: the new plan as JSON.
    """
    if fresh or state.plan is None:
        return None
    newest = state.newest_checkpoint
    if newest is not None or state.metrics:
        refusals, notes = compare_plans(state.plan, plan)
        if refusals:
            raise PlanError(
                f"{state.run_dir} was trained under another model or optimizer, so it cannot continue under "
                f"{plan_file}: " + "; ".join(refusals),
                hint="use another --out for a new run, or --fresh to discard this one",
            )
        if notes and newest is not None:
            print(f"planc: continuing {state.run_dir} under a changed plan: {'; '.join(notes)}", file=sys.stderr)
    finished = state.finished_at(target)
    if finished is not None:
        further = "--steps N trains further, --fresh starts over"
        if state.rerun_refused(plan):
            further = "it has no checkpoint to train further from, so only --fresh runs it again, from step 0"
            if not plan.get("checkpoint"):
                further += " (a `checkpoint { every = N }` block lets a run continue)"
        return (
            f"{state.run_dir} has already finished: {finished} step(s) trained (asked: {target}). "
            f"Nothing to do; {further}."
        )
    if state.rerun_refused(plan):
        raise PlanError(
            f"{state.run_dir} holds {len(state.metrics)} logged step(s) of an earlier run and no checkpoint to "
            "resume from, so running again would mix two runs in its metrics.jsonl",
            hint="pass --fresh to discard them and start over, or choose another --out"
            + ("" if plan.get("checkpoint") else "; add `checkpoint { every = N }` to the plan to resume after a stop"),
        )
    return None


def discard(state: RunState, plan: dict, *, dry_run: bool = False) -> None:
    """``--fresh``: remove the run's metrics, events, heartbeats, checkpoints and resume source.

    Only what planc wrote is removed: the ``step-N`` (``.tmp``, ``.corrupt``) entries of the checkpoint
    folder, never the folder's other files, so a ``dir`` that points at a folder shared with something
    else (an old plan; ``planc check`` now refuses one outside the run directory) loses nothing else.
    ``dry_run`` (``--print``) says what would go and deletes nothing.
    """
    folders = {state.checkpoint_dir, state.run_dir / (plan.get("checkpoint") or {}).get("dir", "checkpoints")}
    entries = {e.path for folder in folders if folder is not None for e in list_checkpoints(folder)}
    if not dry_run:
        for entry in sorted(entries):
            shutil.rmtree(entry, ignore_errors=True)
        for folder in folders:
            _remove_if_empty(folder)
        shutil.rmtree(state.run_dir / HEARTBEAT_DIR, ignore_errors=True)
        for name in (METRICS_FILE, DISCARDED_FILE, EVENTS_FILE, RESUME_FILE):
            (state.run_dir / name).unlink(missing_ok=True)
    if state.metrics or entries:
        what = "would discard (not with --print)" if dry_run else "discarded"
        print(
            f"planc: --fresh: {what} {len(state.metrics)} logged step(s) and {len(entries)} "
            f"checkpoint(s) in {state.run_dir}",
            file=sys.stderr,
        )


def _remove_if_empty(folder: Path | None) -> None:
    if folder is not None:
        try:
            folder.rmdir()
        except OSError:  # not there, or holds something planc did not write
            pass


def resume_from(source: Path, run_dir: Path, plan: dict, *, target: int, plan_file: str):
    """``--resume-from``: check ``source`` (a run directory or one of its checkpoints).

    Returns ``write(run_dir)``, which records ``resume.json`` once the run directory exists and says
    what carries over. Raises PlanError for anything that cannot carry over (before anything is written).
    """
    checkpoint, source_run = _source_checkpoint(source)
    if run_dir.resolve() == source_run.resolve():
        raise PlanError(
            f"--resume-from {source} is the run directory itself", hint="run again without --resume-from to resume it"
        )
    own = inspect_run(run_dir)
    if own.newest_checkpoint is not None:
        raise PlanError(
            f"{run_dir} already has checkpoints of its own (newest: step {own.newest_checkpoint.step}) and resumes "
            "from those",
            hint="drop --resume-from, or choose another --out",
        )
    old = inspect_run(source_run)
    if old.plan is None:
        raise PlanError(f"{source_run} has no readable plan.json, so planc cannot check that its checkpoint fits")
    refusals, notes = compare_plans(old.plan, plan)
    if refusals:
        raise PlanError(
            f"the checkpoint in {checkpoint} cannot continue under {plan_file}: " + "; ".join(refusals),
            hint="a checkpoint carries over to another layout or device count, not to another model or optimizer",
        )
    step = int(read_metadata(checkpoint)["step"])
    if step >= target:
        raise PlanError(
            f"the checkpoint in {checkpoint} is at step {step}, and this run is to stop at step {target}",
            hint="pass --steps N with N above the checkpoint's step",
        )

    def write(run_dir: Path) -> None:
        write_resume_source(run_dir, checkpoint=checkpoint, step=step, from_run=source_run)
        print(f"planc: continuing from step {step} of {source_run} (checkpoint {checkpoint.name})", file=sys.stderr)
        if notes:
            print(f"planc: this plan differs from that run's: {'; '.join(notes)}", file=sys.stderr)

    return write


def _source_checkpoint(source: Path) -> tuple[Path, Path]:
    """``(checkpoint directory, its run directory)`` for ``--resume-from`` (a run, or a step-N inside one)."""
    if not source.exists():
        raise PlanError(f"--resume-from {source}: no such directory")
    if (source / "planc.json").is_file():  # a checkpoint: <run>/<checkpoint.dir>/step-N
        problems = integrity_problems(source, hash_names=())
        if problems:
            raise PlanError(f"--resume-from {source}: the checkpoint is damaged: {'; '.join(problems)}")
        return source, source.parent.parent
    state = inspect_run(source)
    newest = state.newest_checkpoint
    if newest is None:
        damaged = "; ".join(f"{p.name}: {', '.join(v)}" for p, v in state.problems.items())
        raise PlanError(
            f"--resume-from {source}: no complete checkpoint there" + (f" ({damaged})" if damaged else ""),
            hint="name a run directory whose plan has a checkpoint block, or one of its step-N directories",
        )
    return newest.path, source
