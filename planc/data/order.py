"""The order in which training visits the windows of a token stream: a pure function of (seed, position).

Position ``p`` of the run (step ``s`` takes positions ``s*G .. s*G + G-1``) falls in epoch
``p // N`` at offset ``p % N``; the window it reads is ``permutation(seed, epoch)[offset]``. So
every epoch visits each of the ``N`` windows exactly once, in a fresh order, and the rows of any
step can be computed on their own -- resume, every data-parallel rank and every layout see the
same batches without any iterator state.

The permutation is evaluated per index, never materialised: a balanced Feistel network over the
smallest even number of bits that covers ``N``, with "cycle walking" to stay inside ``[0, N)``
(Black & Rogaway, "Ciphers with Arbitrary Finite Domains", CT-RSA 2002, section 3). A Feistel
network is a bijection whatever its round function, and cycle walking keeps one on the subset,
so the result is a permutation of ``[0, N)`` by construction; the round function only has to
mix well (the splitmix64 finaliser, Steele et al. 2014). Memory is O(batch), not O(N): a
trillion-token stream has ~10^9 windows, whose ``randperm`` would take 8 GB per rank.
"""

from __future__ import annotations

import hashlib

import numpy as np

#: Feistel rounds: Luby-Rackoff needs 3 for a pseudo-random permutation, 4 for a strong one.
ROUNDS = 4
_MASK64 = (1 << 64) - 1


def stream_key(*parts: object) -> int:
    """A 64-bit key from the parts (a stable hash; Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "little")


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective avalanche of 64-bit words (wrapping arithmetic)."""
    z = values.copy()
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


class WindowOrder:
    """Which window each run position reads: a fresh permutation of ``[0, windows)`` per epoch."""

    def __init__(self, windows: int, key: int):
        if windows < 1:
            raise ValueError("a window order needs at least one window")
        self.windows, self.key = windows, key
        #: Half the Feistel width: the network permutes [0, 4**half), the smallest such range >= windows.
        self.half = max(1, ((windows - 1).bit_length() + 1) // 2)

    def _round_keys(self, epoch: int) -> list[np.uint64]:
        return [np.uint64(stream_key(self.key, epoch, r) & _MASK64) for r in range(ROUNDS)]

    def _encrypt(self, x: np.ndarray, keys: list[np.uint64]) -> np.ndarray:
        half, mask = np.uint64(self.half), np.uint64((1 << self.half) - 1)
        left, right = x >> half, x & mask
        for key in keys:
            left, right = right, left ^ (_mix(right ^ key) & mask)
        return (left << half) | right

    def permute(self, offsets: np.ndarray, epoch: int) -> np.ndarray:
        """``permutation(epoch)[offsets]`` for offsets in ``[0, windows)``."""
        keys = self._round_keys(epoch)
        out = self._encrypt(np.asarray(offsets, dtype=np.uint64), keys)
        outside = out >= self.windows
        while outside.any():  # cycle walking: re-encrypt until the value lands in [0, windows)
            out[outside] = self._encrypt(out[outside], keys)
            outside = out >= self.windows
        return out.astype(np.int64)

    def windows_at(self, positions: np.ndarray) -> np.ndarray:
        """The window index read at each run position (positions may span epochs)."""
        positions = np.asarray(positions, dtype=np.int64)
        epochs, offsets = np.divmod(positions, self.windows)
        result = np.empty_like(positions)
        for epoch in np.unique(epochs):
            chosen = epochs == epoch
            result[chosen] = self.permute(offsets[chosen], int(epoch))
        return result
