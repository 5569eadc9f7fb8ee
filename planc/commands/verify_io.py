"""What ``planc verify`` and ``planc verify --simulate`` share: loading the plan where the command
can run, and printing a result as its table or as JSON."""

from __future__ import annotations

import json
from pathlib import Path


def load_for_verify(file: str, command: str, why_not_under_torchrun: str):
    """(plan path, registry, plan) for ``command``, which needs torch and must not run under torchrun."""
    from planc import launch
    from planc.commands.runtime import require_torch
    from planc.dsl.load import load_plan
    from planc.errors import PlanError
    from planc.strategies.registry import load_registry

    if launch.under_torchrun():
        raise PlanError(f"{command} {why_not_under_torchrun}", hint="run it outside torchrun")
    require_torch(command)
    plan_path = Path(file)
    registry = load_registry()
    return plan_path, registry, load_plan(plan_path, strategies=registry)


def print_result(args, result: dict, render_fn, run_dir: Path, saved: Path, name: str) -> None:
    """The result as JSON (--json) or as its table, then where it was written."""
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(render_fn(result))
        print(f"\nwritten to {run_dir / name} (and {saved})")
