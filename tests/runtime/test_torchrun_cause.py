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


# -- a collective timeout that NCCL's watchdog ended (SIGABRT) before planc's monitor reported it ------------


def _nccl_abort_run(run_dir, *, dumps: dict[int, str], world: int = 4):
    """A run directory as NCCL leaves it: every rank's heartbeat still "training" (nobody wrote a word),
    and flight-recorder dumps whose newest entry has ``dumps[rank]``'s state."""
    import pickle

    from planc.rundir.heartbeats import Heartbeat

    for rank in range(world):
        Heartbeat(run_dir, rank, 0).beat(4, "training", current_step=5)
    (run_dir / "flight_recorder").mkdir()
    for rank, state in dumps.items():
        entries = [
            {
                "record_id": 0,
                "profiling_name": "nccl:broadcast",
                "collective_seq_id": 11,
                "state": "completed",
                "process_group": ["0", "default_pg"],
            },
            {
                "record_id": 1,
                "profiling_name": "nccl:all_reduce",
                "collective_seq_id": 12,
                "state": state,
                "process_group": ["0", "default_pg"],
            },
        ]
        dump = {"entries": entries, "version": "2.10", "pg_config": {}}
        (run_dir / "flight_recorder" / f"rank-{rank}").write_bytes(pickle.dumps(dump))


def test_an_nccl_abort_with_dumps_names_the_waiting_rank_and_the_absent_ones(tmp_path, monkeypatch):
    from planc.runtime.torchrun import _ending

    monkeypatch.setenv("PLANC_RUN_DIR", str(tmp_path))
    # ranks 0 and 1 wait in all_reduce #12; rank 2's newest collective completed (it went on to
    # something else and never joined #12); rank 3 wrote no dump
    _nccl_abort_run(tmp_path, dumps={0: "started", 1: "scheduled", 2: "completed"})
    failed = ChildFailedError("train.py", {1: _failure(1, -6, 100), 0: _failure(0, -6, 100), 2: _failure(2, -15, 101)})
    assert _ending(failed) == (
        "rank 0 timed out waiting in all_reduce #12 (default_pg) (NCCL's watchdog aborted it, SIGABRT; "
        "flight-recorder dump in flight_recorder/); did not arrive: rank(s) 2, 3"
    )


def test_a_dump_stamped_a_tick_before_the_heartbeat_still_counts(tmp_path, monkeypatch):
    """A file system stamps a dump's mtime from a coarse clock: written right after the heartbeat's
    time.time(), it can read a few ms older (CI saw this). It is still this attempt's dump."""
    import json
    import os

    from planc.runtime.torchrun import _ending

    monkeypatch.setenv("PLANC_RUN_DIR", str(tmp_path))
    _nccl_abort_run(tmp_path, dumps={0: "started", 1: "scheduled", 2: "completed"})
    beat_time = min(json.loads(p.read_text())["time"] for p in (tmp_path / "heartbeats").glob("*.json"))
    for dump in (tmp_path / "flight_recorder").iterdir():
        os.utime(dump, (beat_time - 0.004, beat_time - 0.004))  # one 4 ms kernel tick earlier
    failed = ChildFailedError("train.py", {1: _failure(1, -6, 100), 0: _failure(0, -6, 100), 2: _failure(2, -15, 101)})
    assert _ending(failed).endswith("did not arrive: rank(s) 2, 3")


def test_a_sigabrt_without_dumps_or_with_an_earlier_attempt_s_dumps_is_a_plain_failure(tmp_path, monkeypatch):
    import os
    import pickle

    from planc.runtime.torchrun import _ending

    monkeypatch.setenv("PLANC_RUN_DIR", str(tmp_path))
    failed = ChildFailedError("train.py", {0: _failure(0, -6, 100), 1: _failure(1, 1, 101)})
    _nccl_abort_run(tmp_path, dumps={})
    assert _ending(failed) == "rank 0 was killed by SIGABRT (the first failure)"
    stale = tmp_path / "flight_recorder" / "rank-0"
    stale.write_bytes(pickle.dumps({"entries": [{"record_id": 0, "state": "started"}], "version": "2.10"}))
    os.utime(stale, (1, 1))  # an earlier attempt's: written long before this attempt's heartbeats
    assert _ending(failed) == "rank 0 was killed by SIGABRT (the first failure)"


def test_a_restart_after_an_nccl_abort_names_the_cause_from_the_dumps(tmp_path):
    from planc.rundir.flight_recorder import read_flight_records
    from planc.rundir.heartbeats import read_heartbeats
    from planc.runtime.attempt import restart_causes

    _nccl_abort_run(tmp_path, dumps={0: "started", 1: "started", 2: "completed"}, world=3)
    previous = read_heartbeats(tmp_path)
    assert restart_causes(previous) == [
        f"rank {r} stopped without a word in step 5 (killed, or its node was lost)" for r in range(3)
    ]
    assert restart_causes(previous, read_flight_records(tmp_path)) == [
        "rank 0 timed out waiting in all_reduce #12 (default_pg) in step 5 (NCCL's watchdog aborted it; "
        "flight-recorder dump)",
        "rank 1 timed out waiting in all_reduce #12 (default_pg) in step 5 (NCCL's watchdog aborted it; "
        "flight-recorder dump)",
        "rank 2 did not arrive in step 5: the others waited for it in a collective",
    ]
