"""Which failure `planc run` names when torchrun gives up: the killed rank, not a bystander."""

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from planc.runtime.torchrun import _cause


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
