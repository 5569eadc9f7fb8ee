"""``planc compile FILE [-o train.py]``: write the training program for a plan."""

from __future__ import annotations

import sys
from pathlib import Path

HELP = "write the torch.distributed training program for a plan"
DESCRIPTION = (
    "Plan the layout (as `planc explain` would), then write a readable Python program that builds "
    "the mesh, the model and each strategy in order, and trains under torchrun. The program needs "
    "planc's runtime installed, not its CLI."
)


def add_arguments(parser) -> None:
    from planc.commands import tolerance

    parser.add_argument("file", help="the .plan file")
    parser.add_argument("-o", "--output", help="where to write the program (default: standard output)")
    parser.add_argument(
        "--tolerance",
        type=tolerance,
        default=None,
        help="planner tolerance: simplest layout within this fraction of the best (default: the plan's)",
    )
    parser.add_argument(
        "--force", action="store_true", help="emit the program even when the layout is predicted not to fit in memory"
    )


def run(args) -> int:
    from planc.codegen import compile_plan
    from planc.dsl.load import load_plan
    from planc.fileio import write_output
    from planc.strategies.registry import load_registry

    registry = load_registry()
    plan = load_plan(Path(args.file), strategies=registry)
    program_name = Path(args.output).name if args.output else "train.py"
    compiled = compile_plan(plan, registry, tolerance=args.tolerance, force=args.force, program_name=program_name)
    for warning in compiled.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if args.output:
        write_output(Path(args.output), compiled.program, option="-o", inputs=(Path(args.file),))
        print(f"wrote {args.output}: {compiled.layout.describe()}", file=sys.stderr)
    else:
        sys.stdout.write(compiled.program)
    return 0
