"""SIGTERM to `planc run` (what Slurm and Kubernetes send) saves a checkpoint and exits 0; a full disk loses nothing.

The run (2 processes, a checkpoint every 3 steps, written in the background with dcp.async_save)
meets a full disk first: rank 1's files of the step-6 checkpoint fail with ENOSPC part-way (the
test-only PLANC_FAULT hook in DCP's writer). Every rank must learn of it, the partial checkpoint
must vanish, the step-3 checkpoint must stay intact, and training must go on. Then SIGTERM goes to
`planc run`: every rank finishes its step, the checkpoint of that step is saved, planc says how to
resume and exits 0, and no process is left. Running again resumes there and matches the
single-process losses; once finished, running again says so instead of launching.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from planc.rundir.checkpoints import integrity_problems, step_dir
from planc.rundir.events import read_events

from .conftest import assert_matches_reference, env, losses, planc_run, processes_in, reference, write_plan

pytestmark = pytest.mark.dist


def test_full_disk_then_sigterm_then_resume(tmp_path):
    plan = write_plan(
        tmp_path / "stop.plan",
        per_node=2,
        layout="tp = 1  pp = 1  dp = 2  zero = 0",
        steps=400,
        checkpoint="every = 3  keep = 2  stop_deadline = 30 s  async_save = true",
    )
    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "planc", "run", str(plan), "--out", str(out)],
        env=env(PLANC_FAULT="save-error@rank=1,step=6,bytes=100"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 240
    while time.time() < deadline and len(losses(out)) < 8:
        time.sleep(0.3)
    assert len(losses(out)) >= 8, "training did not get past step 8"
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr[-4000:]

    # The full disk: named with the rank and the OS error; the previous checkpoint said intact, and it is.
    assert "could not save the checkpoint of step 6 (rank 1: [Errno 28] No space left on device" in stderr
    assert "the previous checkpoint step-00000003 is intact" in stderr
    failed = [e for e in read_events(out) if e["event"] == "checkpoint_failed"]
    assert [(e["step"], e["previous"]) for e in failed] == [(6, 3)]
    assert not (out / "checkpoints" / "step-00000006.tmp").exists()

    # The stop: a complete checkpoint at the step every rank stopped after, and nothing left running.
    (stopped,) = [e for e in read_events(out) if e["event"] == "stopped"]
    step = stopped["step"]
    assert stopped["signal"] == "SIGTERM" and step == max(losses(out))
    assert integrity_problems(step_dir(out / "checkpoints", step)) == []
    assert f"stopped by SIGTERM after step {step}; checkpoint" in stderr and "Resume with: planc run" in stderr
    assert "Traceback" not in stderr and "SignalException" not in stderr
    assert processes_in(out) == []
    os.sync()

    resumed = planc_run(plan, out, "--steps", str(step + 2))
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"resumed from step {step} (checkpoint" in resumed.stdout
    assert sorted(losses(out)) == list(range(1, step + 3))
    assert_matches_reference(losses(out), reference(plan, step + 2))

    finished = planc_run(plan, out, "--steps", str(step + 2))
    assert finished.returncode == 0
    assert f"has already finished: {step + 2} step(s) trained" in finished.stderr
    assert "tokens per step" not in finished.stdout  # nothing was launched
