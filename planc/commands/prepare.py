"""``planc prepare TEXT... --tokenizer tokenizer.json --out DIR``: tokenize a corpus into token files."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HELP = "tokenize text files (plain text, JSON lines) into train.bin / val.bin token files"
DESCRIPTION = (
    "Tokenize plain-text and JSON-lines files (or directories of them) with a local Hugging Face "
    "tokenizer.json, in parallel, into DIR/train.bin and DIR/val.bin (a held-out fraction), each "
    "with a sidecar DIR/NAME.bin.json recording the dtype, vocabulary size, token count and largest id. "
    'A plan trains on them with: train { data = "DIR/train.bin"  val_data = "DIR/val.bin" }. '
    "See docs/data.md."
)


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _workers(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _cores() -> int:
    """Cores this process may run on (a container's CPU set, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def add_arguments(parser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="TEXT", help="text or JSON-lines files, or directories of them")
    parser.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json (read locally)")
    parser.add_argument("--out", required=True, help="directory for train.bin, val.bin and their sidecars")
    parser.add_argument("--text-key", default="text", help="the field holding the text in JSON lines (default: text)")
    parser.add_argument(
        "--val-fraction",
        type=_fraction,
        default=0.01,
        help="fraction of the corpus held out as val.bin (default: 0.01; 0: no validation split)",
    )
    parser.add_argument(
        "--eos",
        default="auto",
        help="separator token after each document: a token of the tokenizer, auto (default: "
        "<|endoftext|>, </s>, <|end_of_text|> or <eos>, whichever it has) or none",
    )
    parser.add_argument(
        "--workers", type=_workers, default=_cores(), help="tokenizer processes (default: one per usable core)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the validation split's phase (default: 0)")
    parser.add_argument("--force", action="store_true", help="replace train.bin / val.bin in --out")


def run(args) -> int:
    from planc.data.corpus import CorpusError
    from planc.data.prepare import Options, PrepareError, prepare
    from planc.data.progress import Progress
    from planc.errors import PlanError

    options = Options(
        inputs=tuple(Path(p) for p in args.inputs),
        tokenizer=Path(args.tokenizer),
        out=Path(args.out),
        text_key=args.text_key,
        val_fraction=args.val_fraction,
        eos=args.eos,
        workers=args.workers,
        seed=args.seed,
        force=args.force,
    )
    if options.out.exists() and not options.out.is_dir():
        raise PlanError(f"--out {options.out} exists and is not a directory")
    try:
        from planc.data.corpus import corpus_files

        total = sum(path.stat().st_size for path in corpus_files(list(options.inputs)))
        progress = Progress("prepare", total)
        try:
            result = prepare(options, progress)
        finally:
            progress.close()
    except (CorpusError, PrepareError) as exc:
        raise PlanError(str(exc)) from None
    for writer in result.written.values():
        print(f"wrote {writer.path}: {writer.tokens:,} tokens ({writer.dtype.name}), {writer.documents:,} documents")
    separator = f"separator {result.eos} (id {result.eos_id})" if result.eos is not None else "no separator"
    print(f"tokenizer vocab {result.vocab_size:,} · {separator} · {result.seconds:.1f} s", file=sys.stderr)
    data = f'data = "{options.out / "train.bin"}"'
    if "val" in result.written:
        data += f'  val_data = "{options.out / "val.bin"}"'
    print(
        f"in a plan (paths are relative to the .plan file): model {{ vocab = {result.vocab_size} ... }}  "
        f"train {{ {data} }}",
        file=sys.stderr,
    )
    return 0
