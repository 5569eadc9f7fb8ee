"""``planc plugins``: every installed strategy, where it comes from, its options; then any problems.

Built-in strategies are listed like third-party ones (they come through the same entry-point
group). A plugin that failed to load is listed under "problems" with its distribution, version
and what is wrong; the exit status is still 0 -- a broken plugin never breaks planc -- unless
``--strict`` is given.
"""

from __future__ import annotations

import argparse
import json
import typing
from typing import Any

from pydantic import BaseModel

from planc.spec.fields import unit_kind_of
from planc.units import format_literal, is_bare_number

HELP = "list the installed strategy plugins (built-in and third-party), their options, and any problems"
DESCRIPTION = (
    "List every strategy registered under the 'planc.strategies' entry points: its name, "
    "the distribution and version it comes from, what it does, and its options "
    "(use NAME { option = value } in a .plan). Plugins that could not be loaded are listed "
    "with the reason. PLANC_PLUGINS=a,b restricts which are loaded."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the listing as JSON")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any plugin has a problem")


def listing(registry) -> dict:
    """The registry as plain data (what ``--json`` prints)."""
    strategies = []
    for name in sorted(registry.strategies, key=lambda n: (not registry.strategies[n].builtin, n)):
        strategy = registry.strategies[name]
        strategies.append(
            {
                "name": name,
                "distribution": strategy.distribution,
                "version": strategy.version,
                "builtin": strategy.builtin,
                "description": strategy.description,
                "after": list(strategy.after),
                "module": strategy.module.__name__,
                "options": describe_options(strategy.options_model),
            }
        )
    problems = [
        {
            "name": p.name,
            "distribution": p.distribution,
            "version": p.version,
            "message": p.message,
            "skipped": p.skipped,
        }
        for p in registry.problems
    ]
    return {"strategies": strategies, "problems": problems}


def run(args: argparse.Namespace) -> int:
    from planc.strategies.registry import load_registry

    data = listing(load_registry())
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        print(render(data))
    return 1 if args.strict and data["problems"] else 0


def render(data: dict) -> str:
    lines = []
    for strategy in data["strategies"]:
        origin = "built-in" if strategy["builtin"] else f"{strategy['distribution']} {strategy['version']}"
        lines.append(f"{strategy['name']}  ({origin})")
        lines.append(f"    {strategy['description']}")
        if strategy["after"]:
            lines.append(f"    applied after: {', '.join(strategy['after'])}")
        for option in strategy["options"]:
            default = "required" if option["required"] else f"default {_show(option['default'], option['unit'])}"
            doc = f" -- {option['description']}" if option["description"] else ""
            kind = option["unit"] or option["type"]
            lines.append(f"    option {option['name']}: {kind}, {default}{doc}")
    if data["problems"]:
        lines.append("")
        lines.append(f"problems ({len(data['problems'])}):")
        for problem in data["problems"]:
            verdict = "skipped" if problem["skipped"] else "warning"
            origin = f"{problem['distribution']} {problem['version']}".strip()
            lines.append(f"  {problem['name']} (from {origin}) [{verdict}]: {problem['message']}")
    return "\n".join(lines)


def _show(value, unit: str | None = None) -> str:
    if unit and is_bare_number(value):
        return format_literal(value, unit)
    if value is None:
        return "from the layout"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, str) else str(value)


def describe_options(model: type[BaseModel]) -> list[dict[str, Any]]:
    """Each option of an Options model: name, type, default, unit and one-line doc (for `planc plugins`)."""
    rows = []
    for name, info in model.model_fields.items():
        default = info.get_default(call_default_factory=True) if not info.is_required() else None
        rows.append(
            {
                "name": name,
                "type": type_name(info.annotation),
                "unit": unit_kind_of(info),
                "default": default,
                "required": info.is_required(),
                "description": " ".join((info.description or "").split()),
            }
        )
    return rows


def type_name(annotation: Any) -> str:
    """``bool``, ``'full' | 'selective'``, ``int``: how a .plan writes values of this type (an
    optional option is simply left out: a .plan has no null, so ``None`` is not listed)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) if isinstance(a, str) else str(a).lower() for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if args and (origin is typing.Union or type(annotation).__name__ == "UnionType"):
        return " | ".join(type_name(a) for a in args if a is not type(None))
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
