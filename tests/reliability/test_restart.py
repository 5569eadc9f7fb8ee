"""A killed process costs at most the steps since the last checkpoint, and nobody has to act.

One `planc run` of 6 steps (2 processes, DDP, a checkpoint every 2 steps) meets three kills, each
injected at an exact point with the test-only PLANC_FAULT hook (planc/runtime/faults.py):

  attempt 0: rank 1 is SIGKILLed half-way through writing the checkpoint of step 4;
  attempt 1: the torchrun agent itself is SIGKILLed as step 5 begins;
  attempt 2: rank 0 is SIGKILLed as step 6 begins.

It must finish by itself with the single-process losses, step for step; the half-written
checkpoint must never be loaded; and the steps trained twice must have given identical losses both
times. Then two checkpoints are damaged (a truncated file, a missing shard) and a longer run must
skip both, resume from the one before, and still match the reference.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from planc.cli import main
from planc.rundir.checkpoints import list_checkpoints
from planc.rundir.events import read_events
from planc.rundir.metrics_file import DISCARDED_FILE, read_metrics

from .conftest import assert_matches_reference, env, losses, planc_run, processes_in, reference, write_plan

pytestmark = pytest.mark.dist

FAULTS = ";".join(
    [
        "kill-in-save@rank=1,step=4,bytes=2000",
        "kill-agent@rank=0,step=5,attempt=1",
        "kill@rank=0,step=6,attempt=2",
    ]
)


def test_three_kills_then_two_damaged_checkpoints(tmp_path, capsys):
    plan = write_plan(
        tmp_path / "restart.plan",
        per_node=2,
        layout="tp = 1  pp = 1  dp = 2  zero = 0",
        steps=6,
        checkpoint="every = 2  keep = 3  max_restarts = 3  stop_deadline = 20 s",
    )
    out = tmp_path / "run"
    done = planc_run(plan, out, PLANC_FAULT=FAULTS)
    assert done.returncode == 0, done.stderr[-4000:]
    expected = reference(plan, 6)
    got = losses(out)
    assert sorted(got) == [1, 2, 3, 4, 5, 6]
    assert_matches_reference(got, expected)

    events = read_events(out)
    attempts = [e for e in events if e["event"] == "attempt"]
    # 0 from scratch; 1 from step 2 (the half-written step-4 checkpoint is never loaded); 2 from step 5,
    # saved when the dying agent's SIGTERM stopped the workers; 3 from step 5 again.
    assert [e["start_step"] for e in attempts] == [0, 2, 5, 5]
    # One worker_failed event for each of attempts 0 and 2: the killed rank, not the survivor that exits right
    # after it (planc.runtime.torchrun._ranked); the heartbeats name the rank that went silent, and where.
    failed = [e for e in events if e["event"] == "worker_failed"]
    assert [(e["local_rank"], e["signal"]) for e in failed] == [(1, "SIGKILL"), (0, "SIGKILL")]
    # and so does the wrapper's report: the killed rank first, its peers "after" it -- never the peer
    # that exited with code 1 when its partner vanished (torchrun's own record named whichever came
    # first in its dict)
    reports = [line for line in done.stderr.splitlines() if line.startswith("planc: local rank")]
    killed = [line for line in reports if not line.endswith(("after local rank 1", "after local rank 0"))]
    assert [line.split(" (pid")[0] for line in killed] == ["planc: local rank 1", "planc: local rank 0"], reports
    assert all(line.endswith(") was killed by SIGKILL") for line in killed), reports
    assert [e["signal"] for e in events if e["event"] == "agent_lost"] == ["SIGKILL"]
    assert attempts[1]["causes"][0].startswith("rank 1 stopped without a word while saving the checkpoint of step 4")
    assert attempts[2]["causes"][0].startswith("every rank stopped on a signal after step 5 and saved")
    assert attempts[3]["causes"][0].startswith("rank 0 stopped without a word in step 6")
    # Steps 3 and 4 ran twice (before the kill and after the restart): bit-identical both times.
    again = {r["step"]: r["loss"] for r in read_metrics(out, DISCARDED_FILE)}
    assert sorted(again) == [3, 4] and all(again[step] == got[step] for step in again)
    assert all(entry.state == "complete" for entry in list_checkpoints(out / "checkpoints"))
    assert processes_in(out) == []

    assert main(["doctor", str(out)]) == 0
    report = capsys.readouterr().out
    assert "finished: all 6 step(s) trained" in report
    assert "restart 1" in report and "restart 3" in report and "torchrun agent was killed by SIGKILL" in report

    # Damage the two newest checkpoints -- step 6 loses its last bytes, step 5 a whole shard -- and train
    # steps 5 and 6 again in one process (a Job in a plain Python process): both are skipped, step 4 is resharded.
    shard = out / "checkpoints" / "step-00000006" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])
    (out / "checkpoints" / "step-00000005" / "__0_0.distcp").unlink()
    single = write_plan(tmp_path / "one.plan", per_node=1, layout="dp = 1", steps=6, checkpoint="every = 2  keep = 3")
    longer = subprocess.run(
        [sys.executable, "-c", CONTINUE_IN_ONE_PROCESS, str(single), str(out)],
        env=env(),
        capture_output=True,
        text=True,
    )
    assert longer.returncode == 0, longer.stderr[-4000:]
    assert "step-00000006 is damaged, skipped" in longer.stderr and "__1_0.distcp has" in longer.stderr
    assert "step-00000005 is damaged, skipped" in longer.stderr and "__0_0.distcp is missing" in longer.stderr
    assert "resumed from step 4 (checkpoint" in longer.stdout
    assert sorted(losses(out)) == list(range(1, 7))
    assert_matches_reference(losses(out), expected)
    assert {e.path.name for e in list_checkpoints(out / "checkpoints") if e.state == "corrupt"} == {
        "step-00000005.corrupt",
        "step-00000006.corrupt",
    }


CONTINUE_IN_ONE_PROCESS = """
import sys
from planc.codegen import compile_plan
from planc.dsl.load import load_plan
from planc.runtime.compose import compose
from planc.runtime.loop import leave, shutdown, train
from planc.strategies.registry import load_registry
registry = load_registry()
compiled = compile_plan(load_plan(sys.argv[1], strategies=registry), registry)
try:
    train(compose(compiled.plan, compiled.layout, registry), steps=6, out_dir=sys.argv[2])
finally:
    shutdown()
leave()
"""
