"""Training data that every parallel layout sees in the same order.

A data source maps an optimizer step to the rows of that step's *global* batch,
``rows_for_step(step, start, stop) -> LongTensor[stop - start, seq_len + 1]`` (inputs are
``[:, :-1]``, targets ``[:, 1:]``; ``batch_for_step(step)`` is every row). It is a pure function
of (seed, step, row): no iterator state, so the data position saved in a checkpoint is just the
step, and DP=1 and DP=8 consume identical rows. Each rank builds only its own rows
(:func:`rank_rows`), never the global batch: at 16 M tokens per step (Llama 3 405B's batch, DP 64)
the whole batch costs every rank 477 ms of a step's host time, its own rows 15 ms
(``python bench/data_rows.py``). :func:`split_micro_batches` then cuts a
rank's rows into micro-batches.

Three sources:

* ``synthetic`` -- a fixed random first-order Markov chain over the vocabulary: every token has
  ``BRANCHING`` possible successors, drawn uniformly; each row walks it from its own random stream
  (seed, step, row). The best achievable loss is ln(BRANCHING)
  (1.39 nats) against ln(vocab) for a model that has learnt nothing, so the loss falls visibly
  within a few dozen steps on a tiny model. Validation (``val_data = "synthetic"``) walks the same
  chain from another random stream.
* a token file (``.bin``: planc's, nanoGPT's or Megatron-LM's layout) -- windows of token ids,
  :mod:`planc.runtime.token_data`.
* any other file -- a text file read as bytes (vocab = 256), cut into windows of seq_len + 1 bytes
  (consecutive windows share one byte, so every byte is a target once), visited in a fresh
  seeded permutation each epoch. The file is memory-mapped, never read whole.

All generate one step's batch at a time, never the dataset. Relative paths resolve against the
plan's directory (``Plan.data_root``) unless the program is given another (``--data-root``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from planc.errors import DataError
from planc.runtime.rows import check_rows, rank_rows
from planc.spec import ModelSpec, TrainSpec

#: Successors per token in the synthetic Markov chain.
BRANCHING = 4

#: Byte-level tokens need this many ids.
BYTE_VOCAB = 256


class DataSource(Protocol):
    global_batch: int
    seq_len: int

    def batch_for_step(self, step: int) -> torch.Tensor:
        """The global batch of ``step``: int64 ``[global_batch, seq_len + 1]``."""
        ...

    def rows_for_step(self, step: int, start: int, stop: int) -> torch.Tensor:
        """Rows ``start .. stop-1`` of the global batch of ``step``, built without the others."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the run directory records about this source (``data.json``)."""
        ...


def _stream_seed(*parts: object) -> int:
    """A 63-bit seed from the parts (a stable hash; Python's ``hash`` is salted per process)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class SyntheticData:
    """Sequences from a fixed random Markov chain with ``BRANCHING`` successors per token."""

    def __init__(self, vocab: int, seq_len: int, global_batch: int, seed: int, *, stream: str = "synthetic"):
        self.vocab, self.seq_len, self.global_batch, self.seed = vocab, seq_len, global_batch, seed
        #: Names the random stream of the walks: the same chain, other sequences for validation.
        self.stream = stream
        table_rng = torch.Generator().manual_seed(_stream_seed(seed, "synthetic-table"))
        #: successors[t] are the tokens that may follow token t.
        self.successors = torch.randint(0, vocab, (vocab, BRANCHING), generator=table_rng)
        # The walk's lookup table, flat: entry BRANCHING * t + c holds BRANCHING * (the c-th
        # successor of t), so a walk carries offsets and each position is one add and one gather.
        self._next_offset = (self.successors * BRANCHING).numpy().ravel()

    def describe(self) -> dict:
        """What the run directory records about this source (``data.json``)."""
        return {"kind": "synthetic", "stream": self.stream, "vocab": self.vocab, "branching": BRANCHING}

    def batch_for_step(self, step: int) -> torch.Tensor:
        return self.rows_for_step(step, 0, self.global_batch)

    def rows_for_step(self, step: int, start: int, stop: int) -> torch.Tensor:
        check_rows(start, stop, self.global_batch)
        rows, length = stop - start, self.seq_len + 1
        first = np.empty(rows, dtype=np.int64)
        steps = np.empty((length - 1, rows), dtype=np.int64)
        for column, row in enumerate(range(start, stop)):
            # One random stream per row, so a rank draws its own rows' numbers and no others
            # (numpy's: no torch op per row on the step's host time).
            rng = np.random.default_rng(_stream_seed(self.seed, self.stream, step, row))
            first[column] = rng.integers(0, self.vocab)
            steps[:, column] = rng.integers(0, BRANCHING, length - 1)
        # A walk is sequential along the sequence, vectorised over the rows. In numpy: a position
        # costs ~1 us where torch's indexing cost ~8 us per op (Llama 3's 8193-token rows took
        # 63-100 ms per step in torch, inside the step a GPU then waits for; now 7-13 ms).
        offsets = np.empty((length, rows), dtype=np.int64)
        offset = first * BRANCHING
        offsets[0] = offset
        for position in range(1, length):
            offset = self._next_offset[offset + steps[position - 1]]
            offsets[position] = offset
        return torch.from_numpy(np.ascontiguousarray(offsets.T) // BRANCHING)


class TextFileData:
    """Byte-level tokens of a text file, in windows of seq_len + 1, shuffled per epoch."""

    def __init__(
        self, path: str | Path, vocab: int, seq_len: int, global_batch: int, seed: int, *, key: str = "train.data"
    ):
        self.path = Path(path)
        self.seq_len, self.global_batch, self.seed = seq_len, global_batch, seed
        if vocab != BYTE_VOCAB:
            from planc.data.check import BYTE_VOCAB_HINT, byte_vocab_message

            raise DataError(f"{byte_vocab_message(key, str(path), vocab)}; {BYTE_VOCAB_HINT}")
        if not self.path.is_file():
            raise DataError(f'{key}: no such file {str(self.path)!r}; give a path to a text file or "synthetic"')
        size = self.path.stat().st_size
        #: windows start every seq_len bytes, so window i holds bytes [i*S, i*S + S + 1).
        self.windows = (size - 1) // seq_len if size > 0 else 0
        if self.windows < 1:
            raise DataError(
                f"{key} {str(self.path)!r} has {size} bytes, fewer than one sequence of "
                f"seq_len + 1 = {seq_len + 1}; use a longer file or a shorter seq_len"
            )
        self._bytes = np.memmap(self.path, dtype=np.uint8, mode="r")
        self._epoch: int | None = None
        self._order: torch.Tensor | None = None

    def _order_of_epoch(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:
            rng = torch.Generator().manual_seed(_stream_seed(self.seed, "text-epoch", epoch))
            self._order, self._epoch = torch.randperm(self.windows, generator=rng), epoch
        assert self._order is not None  # epoch starts at -1, so the first call draws an order
        return self._order

    def describe(self) -> dict:
        """What the run directory records about this source (``data.json``)."""
        return {"path": str(self.path.resolve()), "kind": "bytes", "tokens": len(self._bytes), "windows": self.windows}

    def window(self, index: int) -> torch.Tensor:
        start = index * self.seq_len
        return torch.from_numpy(np.array(self._bytes[start : start + self.seq_len + 1], dtype=np.int64))

    def batch_for_step(self, step: int) -> torch.Tensor:
        return self.rows_for_step(step, 0, self.global_batch)

    def rows_for_step(self, step: int, start: int, stop: int) -> torch.Tensor:
        check_rows(start, stop, self.global_batch)
        rows = []
        for position in range(step * self.global_batch + start, step * self.global_batch + stop):
            epoch, offset = divmod(position, self.windows)
            rows.append(self.window(int(self._order_of_epoch(epoch)[offset])))
        return torch.stack(rows)


def build_source(
    data: str,
    model: ModelSpec,
    *,
    global_batch: int,
    seed: int,
    root: str | Path | None = None,
    key: str = "train.data",
) -> DataSource:
    """The source ``data`` names ("synthetic", a token file or a text file), relative paths under ``root``."""
    from planc.data.paths import is_token_path, resolve

    if data == "synthetic":
        stream = "synthetic" if key == "train.data" else "synthetic-validation"
        return SyntheticData(model.vocab, model.seq_len, global_batch, seed, stream=stream)
    path = resolve(data, root)
    if is_token_path(path):
        from planc.runtime.token_data import TokenFileData

        return TokenFileData(path, model.vocab, model.seq_len, global_batch, seed, key=key)
    return TextFileData(path, model.vocab, model.seq_len, global_batch, seed, key=key)


def build_data(train: TrainSpec, model: ModelSpec, base_dir: str | Path | None = None) -> DataSource:
    """The training data a plan asks for; a relative file path is read relative to ``base_dir``."""
    return build_source(train.data, model, global_batch=train.global_batch, seed=train.seed, root=base_dir)


def build_validation(train: TrainSpec, model: ModelSpec, base_dir: str | Path | None = None) -> DataSource | None:
    """The plan's validation data (None without ``val_data``): batches of the same shape as training's."""
    if train.val_data is None:
        return None
    return build_source(
        train.val_data, model, global_batch=train.global_batch, seed=train.seed, root=base_dir, key="train.val_data"
    )


def inputs_and_targets(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, seq_len + 1]`` -> (inputs ``[:, :-1]``, next-token targets ``[:, 1:]``)."""
    return batch[:, :-1], batch[:, 1:]


def local_batch(source: DataSource, step: int, dp_rank: int, dp: int, micro_batch: int) -> torch.Tensor:
    """Data-parallel rank ``dp_rank``'s rows of the batch of ``step``, built without the other ranks' rows."""
    start, stop = rank_rows(source.global_batch, dp_rank, dp, micro_batch)
    return source.rows_for_step(step, start, stop)


def split_micro_batches(rows: torch.Tensor, micro_batch: int) -> list[torch.Tensor]:
    """A rank's rows in micro-batches of ``micro_batch`` consecutive rows."""
    if rows.shape[0] % micro_batch:
        raise ValueError(f"{rows.shape[0]} sequences are not divisible by micro_batch = {micro_batch}")
    return list(rows.split(micro_batch))
