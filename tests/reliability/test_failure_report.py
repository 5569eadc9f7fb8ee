"""Which rank a restart blames: the one that was killed, not the peer that lost contact with it.

2 processes, 3 steps, restarts on: rank 1 SIGKILLs itself as step 2 begins (the test-only PLANC_FAULT
hook), rank 0 then exits with code 1 (its peer is gone). torchrun sees both down, often in the same
second, and its own "failed" record named whichever came first in its dict; planc names rank 1.
"""

from __future__ import annotations

import pytest

from planc.rundir.events import read_events

from .conftest import planc_run, write_plan

pytestmark = pytest.mark.dist


def test_a_killed_rank_is_named_when_a_restart_follows(tmp_path):
    plan = write_plan(
        tmp_path / "kill.plan",
        per_node=2,
        layout="tp = 1  pp = 1  dp = 2  zero = 0",
        steps=3,
        checkpoint="every = 1  max_restarts = 1  stop_deadline = 10 s",
    )
    out = tmp_path / "run"
    done = planc_run(plan, out, PLANC_FAULT="kill@rank=1,step=2", timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [line for line in done.stderr.splitlines() if line.startswith("planc: local rank")]
    assert reports[0].startswith("planc: local rank 1 (pid ") and reports[0].endswith(") was killed by SIGKILL")
    assert all(line.endswith("after local rank 1") for line in reports[1:])
    failed = [e for e in read_events(out) if e["event"] == "worker_failed"]
    assert [(e["local_rank"], e["signal"]) for e in failed] == [(1, "SIGKILL")]
