"""A run directory read back as a whole: what `planc run` checks before launching and `planc doctor` reports."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planc.rundir.carry_over import read_resume_source
from planc.rundir.checkpoints import CheckpointEntry, integrity_problems, list_checkpoints
from planc.rundir.events import read_events
from planc.rundir.heartbeats import read_heartbeats
from planc.rundir.metrics_file import DISCARDED_FILE, read_metrics


@dataclass
class RunState:
    run_dir: Path
    record: dict[str, Any] | None  # plan.json: plan, layout, strategies, prediction
    metrics: list[dict[str, Any]]
    discarded: list[dict[str, Any]]
    events: list[dict[str, Any]]
    heartbeats: dict[int, dict[str, Any]]
    checkpoints: list[CheckpointEntry]
    resume_source: dict[str, Any] | None
    problems: dict[Path, list[str]] = field(default_factory=dict)  # complete checkpoints that fail their check

    @property
    def plan(self) -> dict[str, Any] | None:
        return (self.record or {}).get("plan")

    @property
    def checkpoint_dir(self) -> Path | None:
        spec = (self.plan or {}).get("checkpoint")
        return self.run_dir / spec["dir"] if isinstance(spec, dict) and "dir" in spec else None

    @property
    def usable_checkpoints(self) -> list[CheckpointEntry]:
        """Complete checkpoints that pass the check made here, oldest first."""
        return [c for c in self.checkpoints if c.state == "complete" and not self.problems.get(c.path)]

    @property
    def newest_checkpoint(self) -> CheckpointEntry | None:
        usable = self.usable_checkpoints
        return usable[-1] if usable else None

    @property
    def last_step(self) -> int:
        """The newest step logged or checkpointed."""
        newest = self.newest_checkpoint
        return max([r["step"] for r in self.metrics] + ([newest.step] if newest else []), default=0)

    def resumable(self, plan: dict[str, Any]) -> bool:
        """Whether running ``plan`` again in this directory resumes from a checkpoint of its own."""
        return self.newest_checkpoint is not None and bool((plan.get("checkpoint") or {}).get("resume", True))

    def rerun_refused(self, plan: dict[str, Any]) -> bool:
        """Whether `planc run` refuses to run ``plan`` again here without ``--fresh``: steps are logged and
        nothing to resume them from, so a new step 1 would follow them in metrics.jsonl. `planc run`
        decides with this, and every hint that names a command to run again (`planc run`'s own after a
        failure, `planc doctor`'s) asks it, so that none names a command that is then refused."""
        return bool(self.metrics) and not self.resumable(plan) and self.resume_source is None

    def finished_at(self, target: int) -> int | None:
        """The step the run finished at, if it trained ``target`` steps or more (else None).

        With a checkpoint block, only a checkpoint counts: a run whose last save failed (a full disk)
        logged and announced its last steps, but their weights are lost, and running it again must
        retrain them from the newest complete checkpoint. Without one, the ``finished`` event counts.
        """
        newest = self.newest_checkpoint
        if self.checkpoint_dir is not None:
            reached = newest.step if newest else 0
        else:
            reached = max((e.get("step", 0) for e in self.events if e["event"] == "finished"), default=0)
        return reached if reached >= target and reached > 0 else None

    def unsaved_finish(self) -> dict[str, Any] | None:
        """The last ``finished`` event when the run trained to its end but the checkpoint there is missing."""
        finished = [e for e in self.events if e["event"] == "finished"]
        if not finished or self.checkpoint_dir is None:
            return None
        newest = self.newest_checkpoint
        return finished[-1] if newest is None or newest.step < finished[-1].get("step", 0) else None


def inspect_run(run_dir: str | Path, *, hashes: bool = False) -> RunState:
    """Read everything in ``run_dir``; complete checkpoints are checked by size (and SHA-256 with ``hashes``)."""
    run_dir = Path(run_dir)
    try:
        record = json.loads((run_dir / "plan.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        record = None
    state = RunState(
        run_dir=run_dir,
        record=record if isinstance(record, dict) else None,
        metrics=read_metrics(run_dir),
        discarded=read_metrics(run_dir, DISCARDED_FILE),
        events=read_events(run_dir),
        heartbeats=read_heartbeats(run_dir),
        checkpoints=[],
        resume_source=read_resume_source(run_dir),
    )
    if state.checkpoint_dir is not None:
        state.checkpoints = list_checkpoints(state.checkpoint_dir)
        for entry in state.checkpoints:
            if entry.state == "complete":
                problems = integrity_problems(entry.path, hash_names=None if hashes else ())
                if problems:
                    state.problems[entry.path] = problems
    return state
