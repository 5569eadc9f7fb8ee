"""``planc presets``: the model and device presets a plan can name, with their numbers."""

from __future__ import annotations

import argparse
import json

HELP = "list the model presets (preset = ...) and device presets (device = ...)"
DESCRIPTION = (
    'List the model presets a model block can start from (preset = "llama3-8b") and the device '
    'presets a hardware block can name (device = "H100-SXM"), with their numbers and sources '
    "(docs: `planc docs language`, section Presets)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", nargs="?", choices=("models", "devices"), help="only the models or only the devices")
    parser.add_argument("--json", action="store_true", help="print the presets' values as JSON")


def run(args: argparse.Namespace) -> int:
    from planc.spec.preset_tables import device_preset_table, model_preset_table
    from planc.spec.presets import HARDWARE_PRESETS, MODEL_PRESETS

    kinds = [args.kind] if args.kind else ["models", "devices"]
    if args.json:
        data = {"models": MODEL_PRESETS, "devices": HARDWARE_PRESETS}
        print(json.dumps({kind: data[kind] for kind in kinds}, indent=2))
        return 0
    tables = {"models": ("Model presets", model_preset_table), "devices": ("Device presets", device_preset_table)}
    blocks = []
    for kind in kinds:
        title, table = tables[kind]
        blocks.append(f"{title}\n\n" + as_text(table()))
    print("\n\n".join(blocks))
    return 0


def as_text(markdown_table: str) -> str:
    """A markdown table as aligned plain text (header, a rule, rows; backticks dropped)."""
    rows = [
        [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        for line in markdown_table.splitlines()
        if not set(line) <= set("|-")
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join("  " + line for line in lines)
