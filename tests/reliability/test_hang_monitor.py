"""The hang report comes from planc's monitor thread, not from the backend's timeout.

Under NCCL a collective timeout never reaches Python: the watchdog aborts the process, and the main
thread waits in a CUDA sync (``.item()``) that has no timeout. So the report must come from a
thread of planc's own, armed as each step begins, which fires at the plan's timeout while the
process groups wait :func:`planc.runtime.hangs.backend_timeout` (longer). gloo runs the same code:
one 2-rank launch (no `planc run`, to stay short), plan timeout 1 s, so gloo's groups would raise
only after 1 + 1 (report grace) + 5 = 7 s. Both ranks begin step 1 (the monitor armed); rank 1 then
hangs (the test-only PLANC_FAULT hook), rank 0 waits in an all-reduce. Rank 0's monitor names rank
1, the all-reduce and step 1, records the ``hang`` event as the monitor's and exits 1 -- the main
thread never returns from the all-reduce, so no exception path can have written the report.
"""

from __future__ import annotations

import time

import pytest
from ranks import RanksFailed, run_ranks

from planc.rundir.events import read_events
from planc.rundir.heartbeats import read_heartbeats

pytestmark = pytest.mark.dist  # starts two processes

TIMEOUT_S = 1
BACKEND_TIMEOUT_S = 7  # 1 s + the report's grace min(1 s, 10 s) + 5 s for the monitor to report and exit


def hang_in_step_one(payload) -> None:
    import os

    import torch
    import torch.distributed as dist

    from planc.runtime.attempt import Attempt
    from planc.runtime.compose import compose
    from planc.spec import Layout, build_plan
    from planc.strategies.registry import load_registry
    from planc.units import Quantity

    plan = build_plan(
        {
            "model": {"layers": 1, "hidden": 32, "heads": 4, "vocab": 64, "seq_len": 16},
            "hardware": {"device": "cpu", "per_node": 2},
            "train": {"global_batch": 4, "micro_batch": 2, "timeout": Quantity(TIMEOUT_S, "time", "1 s")},
        }
    )
    layout = Layout(tp=1, pp=1, dp=2, zero=0, recompute="none", schedule=None, micro_batch=2)
    os.environ["PLANC_FAULT"] = "hang@rank=1,step=1"
    job = compose(plan, layout, load_registry())
    attempt = Attempt(job, out_dir=payload["out"], total_steps=1)
    attempt.before_step(1)  # rank 1 hangs in here
    dist.all_reduce(torch.ones(1))  # rank 0 waits here for rank 1, which never comes
    raise AssertionError("the all-reduce returned: rank 1 did not hang")


def test_the_groups_wait_longer_than_the_monitor():
    from planc.runtime.hangs import backend_timeout

    assert backend_timeout(TIMEOUT_S) == BACKEND_TIMEOUT_S
    assert backend_timeout(600) == 615  # 600 s + min(600 s, 10 s) + 5 s


def test_the_monitor_reports_a_hang_before_the_backend_timeout(tmp_path):
    began = time.time()
    with pytest.raises(RanksFailed) as failed:
        run_ranks("tests/reliability/test_hang_monitor.py:hang_in_step_one", world=2, payload={"out": str(tmp_path)})
    output = str(failed.value)
    assert "rank 0: collective timeout in step 1: all_reduce #" in output, output
    assert f"waited {TIMEOUT_S} s; did not arrive: rank 1 (last heartbeat" in output, output
    (hang,) = [e for e in read_events(tmp_path) if e["event"] == "hang"]
    assert (hang["by"], hang["step"], hang["waiting"], hang["missing"]) == ("monitor", 1, [0], [1])
    assert hang["collective"]["name"] == "all_reduce"
    beats = read_heartbeats(tmp_path)
    assert beats[0]["state"] == "timed_out" and beats[1]["state"] == "training"
    # reported within the timeout plus the grace (1 s each) of the step's start: before gloo's own timeout
    assert hang["time"] - beats[1]["time"] < BACKEND_TIMEOUT_S
    assert time.time() - began < 30
