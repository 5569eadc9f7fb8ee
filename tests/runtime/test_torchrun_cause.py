"""Which failure `planc run` names when torchrun gives up: the killed rank, not a bystander."""

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from planc.rundir.events import read_events
from planc.runtime.torchrun import _cause, _report_failures


def _failure(rank: int, exitcode: int, timestamp: int) -> ProcessFailure:
    failure = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file="<N/A>")
    failure.timestamp = timestamp
    return failure


def test_a_rank_killed_by_a_signal_is_the_cause_even_when_a_bystander_failed_earlier():
    # rank 1 lost contact with the SIGKILLed rank 3 and wrote its error at t = 100; torchrun stamped
    # rank 3's death only when it noticed it, at t = 101 -- the earliest stamp would blame rank 1
    failed = ChildFailedError("train.py", {1: _failure(1, 1, 100), 3: _failure(3, -9, 101), 0: _failure(0, 1, 102)})
    assert failed.get_first_failure()[0] == 1
    rank, failure = _cause(failed)
    assert rank == 3 and failure.signal_name() == "SIGKILL"


def test_without_a_killed_rank_the_earliest_failure_is_the_cause():
    failed = ChildFailedError("train.py", {0: _failure(0, 1, 105), 2: _failure(2, 2, 103)})
    assert _cause(failed)[0] == 2


def test_a_rank_torchrun_sigtermed_while_shutting_down_is_not_the_cause():
    # planc verify's failure: rank 1 exited with code 1, then torchrun SIGTERMed rank 0 (same second)
    failed = ChildFailedError("train.py", {0: _failure(0, -15, 100), 1: _failure(1, 1, 100)})
    rank, failure = _cause(failed)
    assert (rank, failure.exitcode) == (1, 1)
    assert _cause(ChildFailedError("train.py", {0: _failure(0, -15, 100)}))[0] == 0  # the only failure: itself


def test_a_kill_after_torchrun_s_shutdown_timeout_is_not_the_cause():
    # rank 0 failed at t = 100; rank 1 ignored torchrun's SIGTERM and was SIGKILLed 30 s later
    failed = ChildFailedError("train.py", {0: _failure(0, 1, 100), 1: _failure(1, -9, 130)})
    assert _cause(failed)[0] == 0


def test_every_failed_worker_is_reported_the_killed_one_first_and_recorded(tmp_path, capsys, monkeypatch):
    # kill -9 of local rank 1 with restarts on: torchrun saw both ranks down in the same second, and
    # logged rank 0 (exit 1, the first in its dict) as "the" failure
    monkeypatch.setenv("PLANC_RUN_DIR", str(tmp_path))
    _report_failures({0: _failure(0, 1, 100), 1: _failure(1, -9, 100), 2: _failure(2, -15, 101)})
    assert capsys.readouterr().err.splitlines() == [
        "planc: local rank 1 (pid 1001) was killed by SIGKILL",
        "planc: local rank 0 (pid 1000) exited with code 1, after local rank 1",
    ]
    (event,) = read_events(tmp_path)
    assert (event["event"], event["local_rank"], event["signal"]) == ("worker_failed", 1, "SIGKILL")
