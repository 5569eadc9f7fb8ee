"""Stopping on request -- SIGTERM (Slurm, Kubernetes, `kill`, torchrun passing one on) and Ctrl-C -- within a deadline.

The first SIGTERM or SIGINT sets a flag that the training loop reads after each step; the ranks
agree on it (one all-reduce) and leave at the same step, saving a checkpoint first. From that
moment a watchdog thread gives the rank ``deadline`` seconds: a rank that has not finished the step
in flight and the save by then reports what it was doing (its Python stacks) and exits, so a stop
never waits forever; torchrun's shutdown timeout (the same deadline, set by `planc run`)
kills whatever is left a little later. Further SIGTERMs change nothing (Slurm and torchrun may each
send one); a second Ctrl-C interrupts at once.

Under torchrun a rank also asks Linux for SIGTERM when its parent, the torchrun agent, dies
(``PR_SET_PDEATHSIG``): a killed agent leaves no worker training unsupervised -- the workers stop
at the end of the step with a checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class StopRequest:
    """Which signal asked this rank to stop (None: none yet). Truthy once one arrived."""

    def __init__(self) -> None:
        self.signal: str | None = None

    def __bool__(self) -> bool:
        return self.signal is not None


@contextmanager
def stop_on_signals(deadline: float, on_deadline: Callable[[str], None]) -> Iterator[StopRequest]:
    """Turn SIGTERM/SIGINT into a :class:`StopRequest`; call ``on_deadline(signal_name)`` from a watchdog
    thread if the process is still running ``deadline`` seconds after the first one."""
    request = StopRequest()
    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.getsignal(sig) for sig in signals}
    timer: list[threading.Timer] = []

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if request.signal is not None:
            if signum == signal.SIGINT and request.signal == "SIGINT":
                for sig in signals:
                    signal.signal(sig, previous[sig])
                raise KeyboardInterrupt  # a second Ctrl-C: at once
            return  # another SIGTERM (Slurm and torchrun both send one): already stopping
        request.signal = name
        watchdog = threading.Timer(deadline, on_deadline, args=(name,))
        watchdog.daemon = True
        watchdog.start()
        timer.append(watchdog)

    try:
        for sig in signals:
            signal.signal(sig, handler)
    except ValueError:  # not the main thread: leave the signals alone
        yield request
        return
    _stop_when_parent_dies()
    try:
        yield request
    finally:
        for watchdog in timer:
            # Joined, not left to die at exit: a daemon thread ended by interpreter shutdown can abort the
            # process from C++ ("terminate called without an active exception").
            watchdog.cancel()
            watchdog.join(timeout=5)
        for sig in signals:
            signal.signal(sig, previous[sig])


def _stop_when_parent_dies() -> None:
    """Under torchrun on Linux: SIGTERM this process when the agent that started it dies."""
    if not sys.platform.startswith("linux") or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the agent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def exit_after_deadline(message: str) -> None:
    """From the watchdog thread: say why, show every thread's stack, and leave at once (exit 1)."""
    import faulthandler

    print(message, file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    os._exit(1)
