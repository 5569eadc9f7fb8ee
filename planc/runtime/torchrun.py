"""``python -m planc.runtime.torchrun ARGS``: torchrun, with what it reports cut to what matters.

`planc run` launches torchrun through this wrapper (the arguments are torchrun's, unchanged):

* a worker that dies is reported in one planc line (``local rank 1 (pid 4242) was killed by
  SIGKILL``) instead of torchrun's log records, and recorded as a ``worker_failed`` event in the run
  directory (``$PLANC_RUN_DIR``) for `planc doctor`; torchrun then restarts the group if it may;
* when no restart is left, the job ends with one line naming the rank that failed first and how
  (exit code or signal; for a hang, the rank that timed out waiting for it), and exit status 1 --
  not torchrun's traceback and table of every rank;
* a SIGTERM or Ctrl-C passed on by `planc run` ends it quietly (status 128 + the signal) once the
  workers have stopped: no ``SignalException`` traceback.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

#: torchrun's log records that this wrapper replaces by its own line (or by nothing).
_FAILED = "failed (exitcode: %s)"
_QUIET = ("Sending process %s closing signal %s", "Received %s death signal, shutting down workers")


class _WorkerReports(logging.Filter):
    """Turns torchrun's "failed (exitcode ...)" records into a planc line and an event; hides shutdown chatter."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(_FAILED) and isinstance(record.args, tuple) and len(record.args) >= 3:
            exitcode, local_rank, pid = (int(str(value)) for value in record.args[:3])
            _report_worker(exitcode, local_rank, pid)
            return False
        return not message.startswith(_QUIET)


def _report_worker(exitcode: int, local_rank: int, pid: int) -> None:
    from planc.rundir.events import record_event

    how = f"was killed by {signal.Signals(-exitcode).name}" if exitcode < 0 else f"exited with code {exitcode}"
    print(f"planc: local rank {local_rank} (pid {pid}) {how}", file=sys.stderr, flush=True)
    record_event(
        os.environ.get("PLANC_RUN_DIR"),
        "worker_failed",
        local_rank=local_rank,
        pid=pid,
        exitcode=exitcode,
        signal=signal.Signals(-exitcode).name if exitcode < 0 else None,
    )


def _cause(failed: Any) -> tuple[int, Any]:
    """The failure that ended the job. A rank killed by a signal is the cause when there is one: the
    ranks that lost contact with it exit with an error of their own, and the one whose error file
    bears the earliest time can be one of them (torchrun stamps a killed rank, which writes no error
    file, only when it notices the death), so the earliest timestamp alone would blame a bystander."""
    killed = {rank: f for rank, f in failed.failures.items() if f.exitcode < 0}
    if killed:
        rank = min(killed, key=lambda r: killed[r].timestamp)
        return rank, killed[rank]
    return failed.get_first_failure()


def _ending(failed: Any) -> str:
    """What ended the job, in words. A hang first: a rank that timed out in a collective (its heartbeat
    says so) names the ranks that did not arrive in its own line, and the hung rank itself ends later,
    killed by its stop watchdog or by torchrun -- a signal that is not the cause."""
    from planc.rundir.heartbeats import beat_step

    hung = _timed_out_beat(os.environ.get("PLANC_RUN_DIR"))
    if hung is not None:
        return (
            f"rank {hung['rank']} timed out waiting in a collective in step {beat_step(hung)} (a hang: its line above "
            "names the rank(s) that did not arrive)"
        )
    rank, failure = _cause(failed)
    how = f"was killed by {failure.signal_name()}" if failure.exitcode < 0 else f"exited with code {failure.exitcode}"
    return f"rank {rank} {how} (the first failure)"


def _timed_out_beat(run_dir: str | None) -> dict[str, Any] | None:
    """The lowest rank's heartbeat of the last attempt that says it timed out in a collective, if any."""
    if not run_dir:
        return None
    from planc.rundir.heartbeats import newest_attempt, read_heartbeats

    return next((b for b in newest_attempt(read_heartbeats(run_dir)) if b.get("state") == "timed_out"), None)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    for name in ("torch.distributed.elastic.multiprocessing.api", "torch.distributed.elastic.agent.server.api"):
        logging.getLogger(name).addFilter(_WorkerReports())
    try:
        torchrun_main(argv)
    except ChildFailedError as failed:
        print(f"planc: {_ending(failed)}; torchrun stopped the other ranks", file=sys.stderr)
        return 1
    except SignalException as stopped:  # passed on to the workers, which have stopped
        return 128 + int(stopped.sigval)
    return 0


if __name__ == "__main__":
    status = main()
    # Leave without interpreter finalization: after torchrun's SignalException its TCPStore daemon thread
    # is still running, and destroying it at exit aborts the process ("terminate called without an active
    # exception", status -6), which would read as if torchrun itself had crashed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
