"""``planc export RUN_DIR --to DIR``: a run's checkpoint as Hugging Face safetensors (or one torch state dict)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "write a run's checkpoint as Hugging Face safetensors + config.json (or one torch state dict)"
DESCRIPTION = (
    "Export the newest checkpoint of a run directory (or --step N) to DIR: Hugging Face safetensors "
    "(sharded above --max-shard-size) and config.json, which transformers' "
    "AutoModelForCausalLM.from_pretrained(DIR) loads; or, with --format torch, model.pt (planc's "
    "full state dict, for torch.load(..., weights_only=True)) and plan.json. Any layout's checkpoint "
    "exports; one process, about one shard of memory. See docs/weights.md."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (the --out of `planc run`)")
    parser.add_argument("--to", required=True, metavar="DIR", help="directory to write (created; must be new or empty)")
    parser.add_argument("--step", type=int, help="the checkpoint's step (default: the newest complete one)")
    parser.add_argument(
        "--format", dest="fmt", choices=("hf", "torch"), default="hf", help="hf (safetensors, default) or torch"
    )
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="dtype of the written weights")
    parser.add_argument(
        "--max-shard-size", default="5GB", metavar="SIZE", help="largest safetensors file, e.g. 2GB or 500MiB"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty --to")


def run(args: argparse.Namespace) -> int:
    from planc.commands.runtime import require_torch
    from planc.errors import PlanError

    shard_bytes = parse_size(args.max_shard_size)
    require_torch("planc export", "safetensors")
    from planc.weights.export import export_run

    if args.step is not None and args.step < 1:
        raise PlanError(f"--step must be at least 1, got {args.step}")
    done = export_run(
        Path(args.run_dir),
        Path(args.to),
        step=args.step,
        fmt=args.fmt,
        dtype=args.dtype,
        max_shard_bytes=shard_bytes,
        overwrite=args.overwrite,
    )
    from planc.units import format_bytes

    if args.step is None:
        _warn_if_behind(Path(args.run_dir), done.step)
    print(
        f"exported step {done.step} of {args.run_dir} to {done.directory} "
        f"({format_bytes(done.total_bytes)}: {', '.join(done.files)})"
    )
    if args.fmt == "hf":
        print(
            "load it with: AutoModelForCausalLM.from_pretrained("
            f"{str(done.directory)!r}); add your tokenizer's files to the directory for AutoTokenizer"
        )
    return 0


def _warn_if_behind(run_dir: Path, step: int) -> None:
    """The newest checkpoint can be older than the training logged (the last saves failed, or the run
    stopped between two saves): the export then holds older weights than metrics.jsonl suggests."""
    from planc.rundir.metrics_file import read_metrics

    logged = max((r["step"] for r in read_metrics(run_dir)), default=0)
    if logged > step:
        print(
            f"warning: the newest checkpoint of {run_dir} is step {step}, but training logged step {logged}: "
            f"this export lacks the last {logged - step} step(s) (their checkpoint was not saved; "
            f"`planc doctor {run_dir}` says why)",
            file=sys.stderr,
        )


def parse_size(text: str) -> int:
    """``5GB``, ``500 MiB`` or a plain number of bytes -> bytes (a PlanError otherwise)."""
    import re

    from planc.errors import PlanError
    from planc.units import UNITS

    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2) if match else None
    if match is None or (unit and UNITS.get(unit, ("", 0))[0] != "bytes"):
        raise PlanError(f"--max-shard-size {text!r} is not a size", hint="write e.g. 5GB, 2GB or 500MiB")
    size = float(match.group(1)) * (UNITS[unit][1] if unit else 1)
    if size < 1:
        raise PlanError(f"--max-shard-size must be at least 1 byte, got {text!r}")
    return int(size)
