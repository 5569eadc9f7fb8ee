"""The ``planc`` command line: one sub-command per module in :mod:`planc.commands`.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``, and imports only the light half of planc at module level (torch is
imported inside ``run`` by the commands that need it), so ``planc --help``, ``check`` and
``explain`` start fast.

Every :class:`~planc.errors.PlanError` is printed as a message and exits 1 — a user never sees
a traceback for bad input. Anything else is a bug in planc: it is reported as an internal error
(exit 2) with the traceback shown only when ``PLANC_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import traceback
from typing import NoReturn

from planc import __version__
from planc.errors import PlanError, error_dict

#: Sub-command name -> module. Order is the order `planc --help` lists them.
COMMANDS: dict[str, str] = {
    "check": "planc.commands.check",
    "fmt": "planc.commands.fmt",
    "explain": "planc.commands.explain",
    "compile": "planc.commands.compile",
    "run": "planc.commands.run",
    "calibrate": "planc.commands.calibrate",
    "verify": "planc.commands.verify",
    "export": "planc.commands.export",
    "prepare": "planc.commands.prepare",
    "doctor": "planc.commands.doctor",
    "plugins": "planc.commands.plugins",
    "presets": "planc.commands.presets",
    "docs": "planc.commands.docs",
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser, keeping each usage error it reports in ``errors`` (shared by the
    sub-commands' parsers) so that :func:`main` can also print it as JSON under ``--json``."""

    def __init__(self, *args, errors: list[str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.errors = [] if errors is None else errors

    def error(self, message: str) -> NoReturn:
        self.errors.append(message)
        super().error(message)  # the usage line and the message on stderr, exit 2


def build_parser() -> argparse.ArgumentParser:
    errors: list[str] = []
    parser = _Parser(
        errors=errors,
        prog="planc",
        description="planc — compile a declarative .plan into a distributed LLM training program.",
        epilog=(
            "Run `planc COMMAND --help` for a command's options, `planc docs` for the documentation "
            "(planc docs getting-started, language, weights, gpu, ...)."
        ),
    )
    parser.add_argument("--version", action="version", version=f"planc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(
            name, help=module.HELP, description=getattr(module, "DESCRIPTION", module.HELP), errors=errors
        )
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        errors, words = getattr(parser, "errors", []), sys.argv[1:] if argv is None else argv
        if stop.code and errors and _asks_for_json(words):  # a usage error, not --help
            command = next((a for a in words if a in COMMANDS), None)
            help_text = f"planc {command} --help" if command else "planc --help"
            usage = PlanError(errors[-1], hint=f"run `{help_text}` for the options")
            _json_error(argparse.Namespace(json=True), error_dict(usage))
        raise
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    try:
        return int(args._run(args) or 0)
    except PlanError as error:
        print(str(error), file=sys.stderr)
        _json_error(args, error_dict(error))
        return 1
    except KeyboardInterrupt:
        print("planc: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug in planc, not in the user's input
        if os.environ.get("PLANC_DEBUG") == "1":
            traceback.print_exc()
        print(
            f"planc: internal error: {type(exc).__name__}: {exc}\n"
            "This is a bug in planc; set PLANC_DEBUG=1 to see the traceback and please report it.",
            file=sys.stderr,
        )
        _json_error(args, error_dict(PlanError(f"internal error: {type(exc).__name__}: {exc}")))
        return 2


def _asks_for_json(argv: list[str]) -> bool:
    """Whether the command line asks for ``--json`` (argparse also takes an unambiguous prefix,
    e.g. ``--js``), before a ``--`` that ends the options."""
    options = argv[: argv.index("--")] if "--" in argv else argv
    return any(len(a) > 2 and "--json".startswith(a) for a in options)


def _json_error(args: argparse.Namespace, error: dict[str, object]) -> None:
    """With ``--json``, stdout holds exactly one JSON object even on failure: ``{"error": {...}}``
    (what was printed before the failure is discarded by the commands, which write JSON last)."""
    if getattr(args, "json", False):
        print(json.dumps({"error": error}, indent=2))


if __name__ == "__main__":
    raise SystemExit(main())
