"""A progress bar on stderr for long data jobs: drawn only on a terminal, silent in logs and pipes."""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 24
#: Redraw at most this often (seconds): drawing is cheap, a terminal flooded with lines is not.
INTERVAL = 0.1


def clock(seconds: float) -> str:
    """``65 -> 1:05``, ``3725 -> 1:02:05``."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """``prepare  37% |#########               | 12.3/33.1 MB · 4.10 M tokens · 2.3 MB/s · 0:08 left``."""

    def __init__(self, label: str, total_bytes: int, *, stream: TextIO | None = None, enabled: bool | None = None):
        self.label, self.total = label, max(1, total_bytes)
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled if enabled is not None else bool(getattr(self.stream, "isatty", lambda: False)())
        self.done_bytes = self.tokens = 0
        self.started = time.monotonic()
        self._drawn = 0.0

    def update(self, nbytes: int, tokens: int) -> None:
        self.done_bytes += nbytes
        self.tokens += tokens
        now = time.monotonic()
        if self.enabled and now - self._drawn >= INTERVAL:
            self._drawn = now
            self.stream.write("\r" + self.line(now) + "\x1b[K")
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        elapsed = max(1e-9, (now or time.monotonic()) - self.started)
        fraction = min(1.0, self.done_bytes / self.total)
        filled = int(fraction * WIDTH)
        rate = self.done_bytes / elapsed
        left = (self.total - self.done_bytes) / rate if rate > 0 else None
        parts = [
            f"{self.label} {fraction:4.0%} |{'#' * filled}{' ' * (WIDTH - filled)}|",
            f"{self.done_bytes / 1e6:.1f}/{self.total / 1e6:.1f} MB",
            f"{self.tokens / 1e6:.2f} M tokens",
            f"{rate / 1e6:.1f} MB/s",
        ]
        if left is not None and fraction < 1:
            parts.append(f"{clock(left)} left")
        return " · ".join(parts)

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + self.line() + "\x1b[K\n")
            self.stream.flush()
