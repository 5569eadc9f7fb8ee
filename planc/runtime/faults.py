"""Fault injection for planc's own reliability tests: the ``PLANC_FAULT`` environment variable.

TEST ONLY. Nothing in planc sets ``PLANC_FAULT``; a process that finds it set says so on stderr.
The tests use it to kill, hang or fail one rank at an exact point, which no outside signal can hit
reliably. It holds faults separated by ``;``, each ``KIND@key=value,...``:

``kill@rank=R,step=S``           rank R kills itself with SIGKILL as step S begins
``hang@rank=R,step=S``           rank R stops taking part as step S begins (sleeps until it is killed)
``kill-agent@rank=R,step=S``     rank R kills its parent, the torchrun agent, with SIGKILL as step S begins,
                                 and goes on once the kernel has told the workers (PR_SET_PDEATHSIG)
``save-error@rank=R,step=S``     rank R's files of the checkpoint of step S fail with OSError(ENOSPC)
                                 ("No space left on device") after ``bytes=N`` bytes (default 0)
``kill-in-save@rank=R,step=S``   rank R kills itself with SIGKILL after ``bytes=N`` bytes of its files
                                 of the checkpoint of step S (default 0)

``attempt=A`` (default 0) limits a fault to the A-th start of the worker group
(:func:`planc.rundir.events.attempt_number`), so the restarted group does not meet it again; ``attempt=any``
injects it in every attempt. Steps count from 1, as in metrics.jsonl.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

ENV = "PLANC_FAULT"
KINDS = ("kill", "hang", "kill-agent", "save-error", "kill-in-save")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int
    attempt: int | None = 0  # None: every attempt
    bytes: int = 0


def parse_faults(text: str) -> list[Fault]:
    """``"kill@rank=1,step=3;hang@rank=0,step=5,attempt=any"`` -> faults (ValueError says what is wrong)."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        kind, _, args = item.partition("@")
        if kind not in KINDS:
            raise ValueError(f"{ENV}: unknown fault {kind!r} in {item!r}; known: {', '.join(KINDS)}")
        fields: dict[str, int | None] = {}
        for pair in filter(None, args.split(",")):
            key, _, value = pair.partition("=")
            if key not in ("rank", "step", "attempt", "bytes"):
                raise ValueError(f"{ENV}: unknown key {key!r} in {item!r}")
            fields[key] = None if (key == "attempt" and value == "any") else int(value)
        if "rank" not in fields or "step" not in fields:
            raise ValueError(f"{ENV}: {item!r} needs rank=R and step=S")
        faults.append(Fault(kind=kind, **fields))  # type: ignore[arg-type]
    return faults


@lru_cache(maxsize=1)
def _mine(text: str, rank: int, attempt: int) -> tuple[Fault, ...]:
    faults = tuple(f for f in parse_faults(text) if f.rank == rank and f.attempt in (None, attempt))
    if faults:
        print(f"planc: {ENV} is set (test only): rank {rank} will inject {faults}", file=sys.stderr, flush=True)
    return faults


def _faults(kind: str, step: int) -> list[Fault]:
    text = os.environ.get(ENV)
    if not text:
        return []
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    from planc.rundir.events import attempt_number

    attempt = attempt_number()
    return [f for f in _mine(text, rank, attempt) if f.kind == kind and f.step == step]


def at_step_start(step: int) -> None:
    """Called as optimizer step ``step`` (1-based) begins: inject a kill or a hang planned for it."""
    if _faults("kill", step):
        os.kill(os.getpid(), signal.SIGKILL)
    if _faults("kill-agent", step):
        parent = os.getppid()
        os.kill(parent, signal.SIGKILL)
        # Until the kernel has reparented us, which is when it sends the workers their PR_SET_PDEATHSIG
        # signal: so the stop that follows happens after this very step, on every rank.
        deadline = time.monotonic() + 10
        while os.getppid() == parent and time.monotonic() < deadline:
            time.sleep(0.01)
    if _faults("hang", step):
        while True:  # a rank that stopped taking part; signal handlers still run between sleeps
            time.sleep(0.1)


def wrap_checkpoint_writer(writer, step: int) -> None:
    """Make a DCP ``FileSystemWriter`` fail (ENOSPC) or die part-way through the checkpoint of ``step``."""
    for fault in _faults("save-error", step) + _faults("kill-in-save", step):
        writer.fs = _FailingFileSystem(writer.fs, fault)


class _FailingFileSystem:
    """A DCP file system whose streams fail once ``fault.bytes`` bytes have been written through them."""

    def __init__(self, inner, fault: Fault):
        self._inner, self._fault, self.written = inner, fault, 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    @contextmanager
    def create_stream(self, path, mode):
        with self._inner.create_stream(path, mode) as stream:
            yield _FailingStream(stream, self) if "w" in mode else stream

    def consume(self, size: int) -> int:
        """Bytes of a ``size``-byte write that still fit; fails when the budget is spent."""
        room = self._fault.bytes - self.written
        if room >= size:
            self.written += size
            return size
        if room > 0:
            self.written += room
            return room
        if self._fault.kind == "kill-in-save":
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC) + f" (injected by {ENV})")


class _FailingStream:
    def __init__(self, stream, fs: _FailingFileSystem):
        self._stream, self._fs = stream, fs

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        allowed = self._fs.consume(len(view))
        if allowed < len(view):
            self._stream.write(view[:allowed])  # a partial write, as a full disk leaves it
            self._stream.flush()
            self._fs.consume(len(view) - allowed)  # raises (or kills)
        return self._stream.write(view)
