"""``planc check FILE...``: parse and validate plans; print a one-line summary or every error.

Exit status: 0 when every file is a valid plan, 1 when any is not (each error is printed as
``file:line:col: error: ...`` with the source line, a caret and a hint).
"""

from __future__ import annotations

import argparse
import json
import sys

from planc.errors import PlanError

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

    failed = 0
    documents = []
    info = sys.stderr if args.json else sys.stdout
    for name in args.files:
        try:
            plan = load_plan(name)
        except PlanError as error:
            print(str(error), file=sys.stderr)
            failed += 1
            continue
        for note in plan.notes:
            print(f"{name}: note: {note}", file=info)
        if args.json:
            documents.append(plan.to_json())
        else:
            print(f"{name}: ok — {summary(plan)}", file=info)
    if args.json and documents:
        if len(args.files) == 1:
            print(documents[0])
        else:
            print(json.dumps([json.loads(document) for document in documents], indent=2))
    return 1 if failed else 0


def summary(plan) -> str:
    """``llama3-8b, 8.03 B params, 64 × H100-SXM (8 nodes × 8)``."""
    hardware = plan.hardware
    devices = f"{hardware.world_size} × {hardware.device}"
    if hardware.nodes > 1:
        devices += f" ({hardware.nodes} nodes × {hardware.per_node})"
    from planc.explain.visible import visible

    weights = f", starting from the weights in {plan.model.weights}" if plan.model.init == "pretrained" else ""
    return visible(f"{plan.model.name or 'custom model'}, {count(plan.model.params)} params, {devices}{weights}")


def count(n: int) -> str:
    """``8030261248 -> '8.03 B'``: three significant digits with K/M/B/T (beyond, scientific)."""
    if n >= 1e15:
        return f"{float(n):.3g}"
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g} {suffix}"
    return str(n)
