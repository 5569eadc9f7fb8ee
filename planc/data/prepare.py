"""``planc prepare``: text files -> token files (``train.bin``, ``val.bin`` and their sidecars).

The corpus is read as pieces (:mod:`planc.data.corpus`), tokenized by a local Hugging Face
``tokenizers`` file in worker processes (batches of pieces, results consumed in corpus order, at
most a few batches in flight, so memory stays bounded), and written as one id stream per split,
with the separator token after every document (as nanoGPT's and Megatron's preprocessing append
their end-of-text token). The output is the same for any number of workers.

**The held-out split** is systematic: piece ``i`` goes to validation when
``floor((i + 1) f + u) > floor(i f + u)`` for the fraction ``f`` and a seeded phase ``u`` in
[0, 1) -- every ``1/f``-th piece, so the split holds ``f`` of the pieces to within one, spread
evenly over the whole corpus, decided in one pass without knowing the corpus size first.

Files are written as ``NAME.tmp`` and renamed when complete: an interrupted run leaves no file
that looks finished.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from planc.data.corpus import PIECE_BYTES, Piece, corpus_files, pieces
from planc.data.order import stream_key
from planc.data.token_files import DTYPES, dtype_for_vocab, write_sidecar

#: Separator tokens tried in order when --eos is auto (GPT-2/NeoX, Llama 2/Mistral, Llama 3, Gemma).
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
#: Text per batch sent to a worker (bytes), and batches in flight per worker.
BATCH_BYTES = 1 << 20
AHEAD = 2
SPLITS = ("train", "val")


class PrepareError(ValueError):
    """Bad input to ``planc prepare``; the message says what to change."""


@dataclass(frozen=True)
class Options:
    inputs: tuple[Path, ...]
    tokenizer: Path
    out: Path
    text_key: str = "text"
    val_fraction: float = 0.01
    eos: str = "auto"
    """A token of the tokenizer, "auto" (the first of EOS_CANDIDATES it has) or "none"."""
    workers: int = 1
    seed: int = 0
    force: bool = False


@dataclass
class SplitWriter:
    """One split's id stream being written to ``NAME.bin.tmp``."""

    path: Path
    dtype: np.dtype
    tokens: int = 0
    documents: int = 0
    max_id: int = -1
    handle: BinaryIO | None = None

    def write(self, ids: np.ndarray) -> None:
        if self.handle is None:
            self.handle = open(self.temporary, "wb")  # noqa: SIM115 (closed in finish/abort)
        ids.astype(self.dtype).tofile(self.handle)
        self.tokens += len(ids)
        if len(ids):
            self.max_id = max(self.max_id, int(ids.max()))

    @property
    def temporary(self) -> Path:
        return self.path.with_name(self.path.name + ".tmp")

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


@dataclass
class Result:
    written: dict[str, SplitWriter] = field(default_factory=dict)
    vocab_size: int = 0
    eos: str | None = None
    eos_id: int | None = None
    seconds: float = 0.0


def load_tokenizer(path: Path):
    """A ``tokenizers.Tokenizer`` from a local ``tokenizer.json`` (never the network)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise PrepareError("planc prepare needs the tokenizers package: pip install 'planc[data]'") from None
    if not path.is_file():
        raise PrepareError(f"no such tokenizer file: {path} (give a Hugging Face tokenizer.json)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises plain Exception for a file it cannot parse
        raise PrepareError(f"{path} is not a Hugging Face tokenizers file: {exc}") from None


def separator(tokenizer, eos: str) -> tuple[str | None, int | None]:
    """(token, id) appended after each document, or (None, None) for ``--eos none``."""
    if eos == "none":
        return None, None
    candidates = EOS_CANDIDATES if eos == "auto" else (eos,)
    for token in candidates:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token, token_id
    if eos == "auto":
        raise PrepareError(
            f"the tokenizer has none of the usual separator tokens ({', '.join(EOS_CANDIDATES)}); "
            "name its end-of-document token with --eos TOKEN, or pass --eos none"
        )
    raise PrepareError(f"the tokenizer has no token {eos!r} (--eos); name one of its special tokens, or --eos none")


# -- worker processes ---------------------------------------------------------------------------

_worker_tokenizer: Any = None  # the worker process's tokenizers.Tokenizer


def _start_worker(tokenizer_path: str) -> None:
    global _worker_tokenizer
    # One process per core already: the tokenizer's own thread pool would only oversubscribe them.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_tokenizer = load_tokenizer(Path(tokenizer_path))


def _encode(texts: list[str]) -> list[np.ndarray]:
    if _worker_tokenizer is None:
        raise RuntimeError("_encode runs in a worker started by _start_worker")
    encodings = _worker_tokenizer.encode_batch(texts, add_special_tokens=False)
    return [np.asarray(encoding.ids, dtype=np.uint32) for encoding in encodings]


def _batches(files: list[Path], text_key: str) -> Iterator[list[Piece]]:
    batch: list[Piece] = []
    size = 0
    for path in files:
        for piece in pieces(path, text_key):
            batch.append(piece)
            size += piece.nbytes
            if size >= BATCH_BYTES:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _encoded(options: Options, files: list[Path]) -> Iterator[tuple[list[Piece], list[np.ndarray]]]:
    """Each batch of pieces with its ids, in corpus order (``workers`` processes, or this one)."""
    if options.workers <= 1:
        _start_worker(str(options.tokenizer))
        for batch in _batches(files, options.text_key):
            yield batch, _encode([piece.text for piece in batch])
        return
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # no fork of a process that holds the tokenizer
    with ProcessPoolExecutor(
        options.workers, mp_context=context, initializer=_start_worker, initargs=(str(options.tokenizer),)
    ) as pool:
        pending: deque = deque()
        for batch in _batches(files, options.text_key):
            pending.append((batch, pool.submit(_encode, [piece.text for piece in batch])))
            if len(pending) >= AHEAD * options.workers:
                batch, future = pending.popleft()
                yield batch, future.result()
        while pending:
            batch, future = pending.popleft()
            yield batch, future.result()


# -- the whole job ------------------------------------------------------------------------------


class ValSchedule:
    """Systematic sampling: piece i is held out when floor((i+1) f + u) > floor(i f + u)."""

    def __init__(self, fraction: float, seed: int):
        self.fraction = fraction
        self.phase = (stream_key(seed, "val-split") % 2**53) / 2**53
        self.index = 0

    def next_is_val(self) -> bool:
        i, f, u = self.index, self.fraction, self.phase
        self.index += 1
        return math.floor((i + 1) * f + u) > math.floor(i * f + u)


def prepare(options: Options, progress=None) -> Result:
    """Tokenize ``options.inputs`` into ``options.out``; returns what was written."""
    began = time.monotonic()
    files = corpus_files(list(options.inputs))
    tokenizer = load_tokenizer(options.tokenizer)
    result = Result(vocab_size=tokenizer.get_vocab_size(with_added_tokens=True))
    result.eos, result.eos_id = separator(tokenizer, options.eos)
    dtype = DTYPES[dtype_for_vocab(result.vocab_size)]
    _refuse_to_overwrite(options)
    options.out.mkdir(parents=True, exist_ok=True)
    splits = SPLITS if options.val_fraction > 0 else SPLITS[:1]
    writers = {name: SplitWriter(options.out / f"{name}.bin", dtype) for name in splits}
    schedule = ValSchedule(options.val_fraction, options.seed)
    separator_ids = np.asarray([result.eos_id] if result.eos_id is not None else [], dtype=np.uint32)
    try:
        for batch, encoded in _encoded(options, files):
            for piece, ids in zip(batch, encoded):
                writer = writers["val" if "val" in writers and schedule.next_is_val() else "train"]
                writer.write(ids)
                if piece.document_end:
                    writer.write(separator_ids)
                    writer.documents += 1
                if progress is not None:
                    progress.update(piece.nbytes, len(ids))
        for writer in writers.values():
            writer.close()
        _finish(options, writers, files, result, pieces_read=schedule.index)
    except BaseException:
        for writer in writers.values():
            writer.close()
            writer.temporary.unlink(missing_ok=True)
        raise
    result.written = writers
    result.seconds = time.monotonic() - began
    return result


def _refuse_to_overwrite(options: Options) -> None:
    existing = [options.out / f"{name}.bin" for name in SPLITS if (options.out / f"{name}.bin").exists()]
    if existing and not options.force:
        raise PrepareError(f"{existing[0]} exists; choose another --out, or pass --force to replace it")


def _finish(
    options: Options, writers: dict[str, SplitWriter], files: list[Path], result: Result, *, pieces_read: int
) -> None:
    """Check the splits, then rename each complete file into place and write its sidecar."""
    if writers["train"].tokens == 0:
        raise PrepareError(
            "the inputs hold no text to train on" + (" (all of it went to validation)" * (pieces_read > 0))
        )
    if "val" in writers and writers["val"].tokens == 0:
        raise PrepareError(
            f"the validation split is empty: {options.val_fraction:g} of the corpus's {pieces_read} pieces "
            f"(documents, or ~{PIECE_BYTES // 1024} KiB of a text file) rounds to none; raise --val-fraction, "
            "or pass --val-fraction 0 for no validation split"
        )
    tokenizer_info = {"path": str(options.tokenizer.resolve()), "sha256": _sha256(options.tokenizer)}
    for name, writer in writers.items():
        os.replace(writer.temporary, writer.path)
        write_sidecar(
            writer.path,
            split=name,
            dtype=writer.dtype.name,
            vocab_size=result.vocab_size,
            tokens=writer.tokens,
            max_id=writer.max_id,
            documents=writer.documents,
            eos=result.eos,
            eos_id=result.eos_id,
            tokenizer=tokenizer_info,
            sources=[str(path) for path in files[:1000]],
            source_files=len(files),
            text_key=options.text_key,
            val_fraction=options.val_fraction,
            seed=options.seed,
            created_by=_created_by(),
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _created_by() -> str:
    from planc import __version__

    return f"planc {__version__} prepare"
