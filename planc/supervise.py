"""`planc run`'s watch over torchrun: signals passed on, the whole process tree taken down, a lost agent replaced.

torchrun runs in a session of its own (so a terminal's Ctrl-C reaches only `planc run`, which
decides what to pass on), and each worker in yet another one (torchrun's choice). So that no
process outlives the run:

* **SIGTERM, SIGHUP or Ctrl-C to `planc run`** is passed to torchrun, which passes it to every worker
  once and waits up to its shutdown timeout (the plan's stop deadline): the workers finish the step
  in flight, save a checkpoint and exit. If the tree is still there ``deadline + GRACE`` seconds
  later, every process in it is killed. A second Ctrl-C kills it at once.
* **torchrun dies with `planc run` (even by SIGKILL):** torchrun is started with
  ``PR_SET_PDEATHSIG = SIGTERM``, and so are the workers under it (see
  :mod:`planc.runtime.preemption`), so a killed parent turns into an orderly stop below it.
* **torchrun killed on its own:** `planc run` is the *child subreaper* of the tree
  (``PR_SET_CHILD_SUBREAPER``), so the orphaned workers become its children; it waits for them to
  stop (they save a checkpoint), and starts torchrun again while restarts remain.

Linux provides the ``prctl`` calls; elsewhere the signals are still passed on, without the rest.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

#: Seconds past the stop deadline before the whole tree is killed (torchrun's own SIGKILL comes first).
GRACE = 10.0
_LINUX = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36


@dataclass
class Outcome:
    """How torchrun ended: its exit status, and the signal `planc run` passed on (None: none)."""

    status: int
    stop_signal: str | None = None


def _prctl(option: int, value: int) -> None:
    if _LINUX:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def _die_with_parent() -> None:  # runs in the child between fork and exec
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (from /proc; empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1 and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(root: int) -> None:
    """SIGKILL ``root`` and everything below it (stopped first, so that it starts nothing new)."""
    for sig, targets in ((signal.SIGSTOP, [root]), (signal.SIGKILL, descendants(root) + [root])):
        for pid in targets:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


class Supervisor:
    """Run ``argv`` (torchrun) under the rules of the module docstring."""

    def __init__(self, argv: list[str], *, cwd: Path, env: dict[str, str], deadline: float):
        self.argv, self.cwd, self.env, self.deadline = argv, cwd, env, deadline
        self.process: subprocess.Popen | None = None
        self.stop_signal: str | None = None
        self.stop_since: float | None = None

    def run(self) -> Outcome:
        """Start torchrun and wait for it (and the processes it leaves behind) to end."""
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        for sig in previous:
            signal.signal(sig, self._on_signal)
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)
        try:
            self.process = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                start_new_session=True,
                preexec_fn=_die_with_parent if _LINUX else None,
            )
            status = self._wait(self.process)
            self._wait_for_orphans()
            return Outcome(status, self.stop_signal)
        finally:
            _prctl(_PR_SET_CHILD_SUBREAPER, 0)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.process is None or self.process.poll() is not None:
            self.stop_signal = self.stop_signal or name
            return
        if self.stop_signal is None:
            self.stop_signal, self.stop_since = name, time.monotonic()
            os.kill(self.process.pid, signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
        elif signum == signal.SIGINT:  # a second Ctrl-C: now
            kill_tree(self.process.pid)

    def _wait(self, process: subprocess.Popen) -> int:
        while True:
            try:
                return process.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                if self.stop_since is not None and time.monotonic() - self.stop_since > self.deadline + GRACE:
                    kill_tree(process.pid)

    def _wait_for_orphans(self) -> None:
        """Workers whose torchrun died are ours now (subreaper): let them stop, within the deadline."""
        limit = time.monotonic() + self.deadline + GRACE
        while True:
            left = descendants(os.getpid())
            if not left:
                return
            if time.monotonic() > limit:
                for pid in left:
                    kill_tree(pid)
            try:
                os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            time.sleep(0.2)
