"""Batches of token files: ``seq_len + 1`` windows of a memory-mapped id stream, in a seeded order.

Window ``i`` holds ids ``[i*S, i*S + S + 1)`` (S = seq_len: consecutive windows share one id,
so every id but the first is a target exactly once per epoch). Step ``s`` reads the windows at
run positions ``s*G .. s*G + G-1`` of :class:`planc.data.order.WindowOrder` (a rank only its own
rows' positions) -- a pure function of (seed, step), like the synthetic and byte-text sources,
so resume and every layout see the same batches. Each batch's largest id is checked against the
model's vocabulary (an out-of-range id would otherwise index past the embedding and fail far from
its cause).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from planc.data.order import WindowOrder, stream_key
from planc.data.token_files import TokenFileError, open_token_file
from planc.errors import DataError
from planc.runtime.rows import check_rows


class TokenFileData:
    """Token-id windows of a token file (planc, nanoGPT or Megatron layout), shuffled per epoch."""

    def __init__(
        self, path: str | Path, vocab: int, seq_len: int, global_batch: int, seed: int, *, key: str = "train.data"
    ):
        self.key, self.vocab = key, vocab
        self.seq_len, self.global_batch, self.seed = seq_len, global_batch, seed
        try:
            self.file = open_token_file(path)
        except TokenFileError as exc:
            raise DataError(f"{key}: {exc}") from None
        self.ids = self.file.array()
        self.windows = (self.file.tokens - 1) // seq_len if self.file.tokens > 0 else 0
        if self.windows < 1:
            raise DataError(
                f"{key}: {self.file.path} has {self.file.tokens} tokens, fewer than one sequence of "
                f"seq_len + 1 = {seq_len + 1}; use more data or a shorter seq_len"
            )
        if self.file.max_id is not None and self.file.max_id >= vocab:
            raise DataError(self._beyond_vocab(self.file.max_id, "its sidecar records"))
        self.order = WindowOrder(self.windows, stream_key(seed, "token-windows"))

    def _beyond_vocab(self, largest: int, how: str) -> str:
        return (
            f"{self.key}: {self.file.path} holds token id {largest} ({how}), but model.vocab = {self.vocab} "
            f"(ids 0..{self.vocab - 1}); set vocab to the tokenizer's size, or prepare the data with the "
            "model's tokenizer"
        )

    def window(self, index: int) -> np.ndarray:
        start = index * self.seq_len
        return self.ids[start : start + self.seq_len + 1]

    def batch_for_step(self, step: int) -> torch.Tensor:
        return self.rows_for_step(step, 0, self.global_batch)

    def rows_for_step(self, step: int, start: int, stop: int) -> torch.Tensor:
        check_rows(start, stop, self.global_batch)
        first = step * self.global_batch
        positions = np.arange(first + start, first + stop, dtype=np.int64)
        rows = np.stack([self.window(int(i)) for i in self.order.windows_at(positions)]).astype(np.int64)
        largest = int(rows.max())
        if largest >= self.vocab:
            raise DataError(self._beyond_vocab(largest, f"in the batch of step {step + 1}"))
        return torch.from_numpy(rows)

    def describe(self) -> dict:
        """What the run directory records about this source (``data.json``)."""
        return {
            "path": str(Path(self.file.path).resolve()),
            "kind": "tokens",
            "layout": self.file.layout,
            "dtype": self.file.dtype.name,
            "tokens": self.file.tokens,
            "windows": self.windows,
            "vocab_size": self.file.vocab_size,
            "tokenizer": (self.file.sidecar or {}).get("tokenizer"),
        }
