"""``planc check FILE...``: parse and validate plans; print a one-line summary or every error.

Exit status: 0 when every file is a valid plan, 1 when any is not (each error is printed as
``file:line:col: error: ...`` with the source line, a caret and a hint).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from planc.errors import PlanError, error_dict

if TYPE_CHECKING:
    from planc.spec.plan import Plan

HELP = "parse and validate .plan files (exit 1 with located messages if any is wrong)"
DESCRIPTION = (
    "Parse and validate .plan files. Prints one summary line per valid file, or every "
    "problem found with its file:line:col, the source line and a hint. Exit status 0 when "
    "all files are valid, 1 otherwise."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help=".plan files to check")
    parser.add_argument(
        "--json", action="store_true", help="print the validated plan as JSON (a list when several files are given)"
    )


def run(args: argparse.Namespace) -> int:
    from planc.dsl import load_plan
    from planc.strategies.registry import load_registry

    registry = load_registry()
    failed = 0
    documents: list[str] = []
    info = sys.stderr if args.json else sys.stdout
    for name in args.files:
        try:
            plan = load_plan(name, strategies=registry)
        except PlanError as error:
            print(str(error), file=sys.stderr)
            failed += 1
            documents.append(json.dumps({"file": name, "error": error_dict(error)}))
            continue
        for note in plan.notes:
            print(f"{name}: note: {note}", file=info)
        if args.json:
            documents.append(plan.to_json())
        else:
            print(f"{name}: ok — {summary(plan)}", file=info)
    for notice in registry.notices():  # once, whatever the number of files
        print(f"warning: {notice}", file=sys.stderr)
    if args.json:
        # One file: its plan, or {"error": ...}; several: a list of those, in the order given.
        if len(args.files) != 1:
            print(json.dumps([json.loads(document) for document in documents], indent=2))
        elif failed:
            print(json.dumps({"error": json.loads(documents[0])["error"]}, indent=2))
        else:
            print(documents[0])
    return 1 if failed else 0


def summary(plan: Plan) -> str:
    """``llama3-8b, 8.03 B params, 64 × H100-SXM (8 nodes × 8)``."""
    from planc.explain.visible import visible
    from planc.units import format_count

    hardware = plan.hardware
    devices = f"{hardware.world_size} × {hardware.device}"
    if hardware.nodes > 1:
        devices += f" ({hardware.nodes} nodes × {hardware.per_node})"
    from planc.weights.plan_checks import weights_directory

    pretrained = plan.model.init == "pretrained"
    weights = f", starting from the weights in {weights_directory(plan.model, plan.data_root)}" if pretrained else ""
    return visible(f"{plan.model.name or 'custom model'}, {format_count(plan.model.params)} params, {devices}{weights}")
