"""``planc doctor RUN_DIR``: what happened to a run, and what to do next -- the first command after a failed night."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HELP = "say what happened to a run: checkpoints, restarts, hangs, errors, what to do next"
DESCRIPTION = (
    "Read a run directory (plan.json, events.jsonl, heartbeats/, metrics.jsonl, checkpoints/) and report "
    "how far the run got and what a resume would repeat, every restart and its cause, per-rank errors, "
    "hangs (the rank that did not arrive, the collective, the step), damaged or failed checkpoints, "
    "predicted against measured memory and step time, and what to do next. Exit status 0 when the run "
    "finished, is running, or stopped with a checkpoint to resume from; 1 otherwise."
)


def add_arguments(parser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `planc run`")
    parser.add_argument(
        "--verify", action="store_true", help="also check every checkpoint file's SHA-256 (reads them all)"
    )
    parser.add_argument("--json", action="store_true", help="print the facts as JSON")


def run(args) -> int:
    from planc.errors import PlanError
    from planc.rundir.diagnose import diagnose
    from planc.rundir.state import inspect_run

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise PlanError(f"{run_dir} is not a directory", hint="pass the run directory `planc run` wrote")
    state = inspect_run(run_dir, hashes=args.verify)
    if state.record is None and not state.events and not state.metrics:
        raise PlanError(
            f"{run_dir} does not look like a run directory (no plan.json, events.jsonl or metrics.jsonl)",
            hint="pass the directory given to `planc run --out`",
        )
    report = diagnose(state)
    if args.json:
        sections = {title: lines for title, lines in report.sections}
        json.dump({**report.facts, "sections": sections}, sys.stdout, indent=2)
        print()
    else:
        print(report.text())
    healthy = report.status in ("finished", "running") or (
        report.status == "stopped" and report.facts.get("checkpoint_step") == report.facts.get("logged_step")
    )
    return 0 if healthy else 1
