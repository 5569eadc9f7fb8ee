"""A rank that stops taking part ends every rank within the timeout plus a bounded grace, named with the
collective and the step.

Rank 1 of 2 stops as step 3 begins (the test-only PLANC_FAULT hook: it sleeps). Rank 0 waits in the
step's gradient all-reduce until the plan's collective timeout (3 s), waits up to the report grace
(min(timeout, 10 s)) for the other ranks' heartbeats, then names rank 1, the all-reduce (from the
flight recorder) and step 3, and exits; torchrun then stops rank 1, whose watchdog ends it after the
stop deadline (3 s). Bound: timeout + grace + deadline + 6 s for process start and teardown.
"""

from __future__ import annotations

import time

import pytest

from planc.cli import main
from planc.rundir.events import read_events
from planc.rundir.heartbeats import read_heartbeats

from .conftest import planc_run, processes_in, write_plan

pytestmark = pytest.mark.dist

TIMEOUT, GRACE, DEADLINE, TEARDOWN = 3.0, 3.0, 3.0, 6.0


def test_a_hung_rank_is_named_and_every_rank_ends(tmp_path, capsys):
    plan = write_plan(
        tmp_path / "hang.plan",
        per_node=2,
        layout="tp = 1  pp = 1  dp = 2  zero = 0",
        steps=6,
        timeout="3 s",
        checkpoint="every = 2  max_restarts = 0  stop_deadline = 3 s",
    )
    out = tmp_path / "run"
    done = planc_run(plan, out, PLANC_FAULT="hang@rank=1,step=3")
    ended = time.time()
    assert done.returncode == 1, done.stderr[-4000:]
    assert "rank 0: collective timeout in step 3: all_reduce #" in done.stderr
    assert "waited 3 s; did not arrive: rank 1 (last heartbeat" in done.stderr
    assert "rank 1: still busy 3 s after SIGTERM" in done.stderr  # the hung rank's own watchdog
    # The job's last line names the hang, not the signal that the watchdog (or torchrun) ended rank 1 with.
    assert "planc: rank 0 timed out waiting in a collective in step 3 (a hang" in done.stderr
    assert "(the first failure)" not in done.stderr
    (hang,) = [e for e in read_events(out) if e["event"] == "hang"]
    assert (hang["step"], hang["missing"], hang["waiting"]) == (3, [1], [0])
    assert hang["collective"]["name"] == "all_reduce" and hang["collective"]["ranks"] == [0, 1]
    assert read_heartbeats(out)[1]["state"] == "deadline_exceeded"
    started = [e for e in read_events(out) if e["event"] == "checkpoint_saved"][-1]["time"]  # step 2's, then step 3
    assert ended - started < TIMEOUT + GRACE + DEADLINE + TEARDOWN, f"took {ended - started:.1f} s"
    assert processes_in(out) == []

    assert main(["doctor", str(out)]) == 1
    report = capsys.readouterr().out
    assert "step 3: all_reduce #" in report and "did not arrive: rank(s) 1" in report
    assert "find out why rank(s) 1 stopped taking part in step 3" in report
