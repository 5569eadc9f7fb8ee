"""``planc fmt FILE...``: print plans in canonical form, rewrite them, or check that they are.

See :mod:`planc.dsl.fmt` for what the canonical form is. Only the syntax must be valid: a plan
that `planc check` rejects for its values can still be formatted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planc.fileio import write_text_atomically

HELP = "print .plan files in canonical form (--write rewrites them, --check tests them)"
DESCRIPTION = (
    "Format .plan files canonically: fixed block order, two-space indent, aligned '=', "
    "comments and literals kept as written. Prints the result unless --write or --check."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help=".plan files to format")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", "-w", action="store_true", help="rewrite each file in place (if it changes)")
    mode.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if any file is not in canonical form"
    )


def run(args: argparse.Namespace) -> int:
    from planc.dsl import format_plan, parse
    from planc.dsl.load import read_plan_text
    from planc.errors import PlanError

    status = 0
    for name in args.files:
        try:
            text = read_plan_text(Path(name))
            formatted = format_plan(parse(text, name))
        except PlanError as error:
            print(str(error), file=sys.stderr)
            status = 1
            continue
        if args.check:
            if formatted != text:
                print(f"{name}: not in canonical form (run `planc fmt --write {name}`)", file=sys.stderr)
                status = 1
        elif args.write:
            if formatted != text:
                write_text_atomically(Path(name), formatted)
                print(f"{name}: reformatted", file=sys.stderr)
        else:
            sys.stdout.write(formatted)
    return status
