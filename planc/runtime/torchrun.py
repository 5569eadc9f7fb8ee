"""``python -m planc.runtime.torchrun ARGS``: torchrun, with what it reports cut to what matters.

`planc run` launches torchrun through this wrapper (the arguments are torchrun's, unchanged):

* a worker that dies is reported in one planc line (``local rank 1 (pid 4242) was killed by
  SIGKILL``) instead of torchrun's log records, and recorded as a ``worker_failed`` event in the run
  directory (``$PLANC_RUN_DIR``) for `planc doctor`; the ranks that went down after it get a line
  each (``..., after local rank 1``), the ranks torchrun itself SIGTERMed none; torchrun then
  restarts the group if it may;
* when no restart is left, the job ends with one line naming the rank that failed first and how
  (exit code or signal; for a hang, the rank that timed out waiting for it -- also when NCCL's
  watchdog aborted it, SIGABRT, with a flight-recorder dump), and exit status 1 -- not torchrun's
  traceback and table of every rank;
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
    """Hides torchrun's "failed (exitcode ...)" record (:func:`_watch_worker_failures` reports every failed
    worker instead: the record names the failure with the smallest timestamp, a race) and its shutdown chatter."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(_FAILED) and isinstance(record.args, tuple) and len(record.args) >= 3:
            if not _WATCHING:  # a torchrun whose agent could not be watched: its choice, as it logged it
                exitcode, local_rank, pid = (int(str(value)) for value in record.args[:3])
                _report_worker(exitcode, local_rank, pid)
            return False
        return not message.startswith(_QUIET)


#: Whether :func:`_watch_worker_failures` is in place.
_WATCHING = False
#: A signal-killed rank stamped this many seconds after the earliest failure is not the cause: torchrun
#: escalates its shutdown SIGTERM to SIGKILL after a timeout. Within it, the kill is the cause (see _ranked).
_SAME_FAILURE_S = 2


def _watch_worker_failures() -> None:
    """Report a failed worker group from torchrun's own result (every rank's exit code and time), once per
    failure, by wrapping its agent's monitor: the cause first, then the ranks that went down after it."""
    global _WATCHING
    try:
        from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

        monitor = LocalElasticAgent._monitor_workers
    except (ImportError, AttributeError):
        return

    def _monitor_workers(self, worker_group):
        result = monitor(self, worker_group)
        failures = getattr(result, "failures", None)
        if failures and result.is_failed():
            _report_failures(failures)
        return result

    LocalElasticAgent._monitor_workers = _monitor_workers  # type: ignore[method-assign]
    _WATCHING = True


def _report_failures(failures: dict[int, Any]) -> None:
    """One line per failed rank, the cause first; the cause alone is the ``worker_failed`` event."""
    ranked = _ranked(failures)
    (_, cause), rest = ranked[0], ranked[1:]
    _report_worker(cause.exitcode, cause.local_rank, cause.pid)
    for _, failure in rest:
        how = _how(failure.exitcode)
        print(
            f"planc: local rank {failure.local_rank} (pid {failure.pid}) {how}, after local rank {cause.local_rank}",
            file=sys.stderr,
            flush=True,
        )


def _how(exitcode: int) -> str:
    return f"was killed by {signal.Signals(-exitcode).name}" if exitcode < 0 else f"exited with code {exitcode}"


def _report_worker(exitcode: int, local_rank: int, pid: int) -> None:
    from planc.rundir.events import record_event

    print(f"planc: local rank {local_rank} (pid {pid}) {_how(exitcode)}", file=sys.stderr, flush=True)
    record_event(
        os.environ.get("PLANC_RUN_DIR"),
        "worker_failed",
        local_rank=local_rank,
        pid=pid,
        exitcode=exitcode,
        signal=signal.Signals(-exitcode).name if exitcode < 0 else None,
    )


def _ranked(failures: dict[int, Any]) -> list[tuple[int, Any]]:
    """The failed ranks, the one that failed first first; the ranks torchrun itself ended are left out.

    * A rank killed by SIGTERM is torchrun's doing when another rank failed: it SIGTERMs the survivors
      when one fails (planc's workers handle a SIGTERM from outside: they stop and save, and exit 0).
    * A rank killed by another signal (SIGKILL, the OOM killer's) is the cause over one that exited
      with an error near the same time: the ranks that lost contact with it exit with an error of their
      own, and a rank that exits writes its time itself, while torchrun stamps a killed rank only when
      it notices the death (whole seconds), so the earliest timestamp alone can blame a bystander.
      A kill stamped :data:`_SAME_FAILURE_S` or more after the first failure is torchrun's escalation.
    * Otherwise the earliest timestamp, then the lowest rank.
    """
    shutdown = -int(signal.SIGTERM)
    own = {rank: f for rank, f in failures.items() if f.exitcode != shutdown} or dict(failures)
    first = min(f.timestamp for f in own.values())

    def order(item: tuple[int, Any]) -> tuple[bool, int, int]:
        rank, failure = item
        killed = failure.exitcode < 0 and failure.timestamp < first + _SAME_FAILURE_S
        return (not killed, failure.timestamp, rank)

    return sorted(own.items(), key=order)


def _cause(failed: Any) -> tuple[int, Any]:
    """The failure that ended the job (see :func:`_ranked`)."""
    return _ranked(failed.failures)[0]


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
    aborted = _aborted_by_watchdog(failed, os.environ.get("PLANC_RUN_DIR"))
    if aborted is not None:
        return aborted
    rank, failure = _cause(failed)
    return f"rank {rank} {_how(failure.exitcode)} (the first failure)"


def _aborted_by_watchdog(failed: Any, run_dir: str | None) -> str | None:
    """A collective timeout that NCCL's watchdog ended (SIGABRT) before planc's monitor reported it:
    the waiting rank and the ranks that did not arrive, from the attempt's flight-recorder dumps.
    Without this the aborted rank -- one that *waited* -- would read as the cause."""
    if not run_dir or not any(f.exitcode == -int(signal.SIGABRT) for f in failed.failures.values()):
        return None
    from planc.rundir.flight_recorder import read_flight_records, timeout_words
    from planc.rundir.heartbeats import newest_attempt, read_heartbeats

    beats = newest_attempt(read_heartbeats(run_dir))
    since = min((float(b.get("time", 0)) for b in beats), default=0.0)  # dumps of this attempt only
    records = read_flight_records(run_dir, since=since)
    return timeout_words(records, [b["rank"] for b in beats] or sorted(records))


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
    _watch_worker_failures()
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
