"""The Job in one process without torchrun (a process group of one), and its clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from planc.runtime.reference import train_reference
from planc.spec import build_plan

pytestmark = pytest.mark.dist  # every test here starts a fresh python process

PLAN = {
    "model": {"layers": 2, "hidden": 32, "heads": 4, "vocab": 64, "seq_len": 16, "vocab_multiple": 32},
    "hardware": {"device": "cpu", "per_node": 1},
    "train": {"global_batch": 4, "precision": "fp32", "lr": 1e-2, "steps": 3, "seed": 3},
}

SCRIPT = """
import json, sys
from planc.runtime.compose import compose
from planc.runtime.loop import shutdown, train
from planc.spec import Layout, build_plan
from planc.strategies.registry import load_registry
plan = build_plan(json.loads(sys.argv[1]))
layout = Layout(**json.loads(sys.argv[2]))
try:
    job = compose(plan, layout, load_registry())
    print(json.dumps([r["loss"] for r in train(job, quiet=True)]))
except RuntimeError as error:
    print(json.dumps({"error": str(error)}))
finally:
    shutdown()
"""


def run(layout: dict) -> object:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(PLAN), json.dumps(layout)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_single_process_job_matches_the_reference():
    # micro_batch 2 of 4 rows: two accumulated micro-batches, the same as the reference's.
    losses = run(dict(tp=1, pp=1, dp=1, zero=0, recompute="selective", schedule=None, micro_batch=2))
    reference = train_reference(build_plan(PLAN), steps=3, micro_batch=2).losses
    assert max(abs(a - b) for a, b in zip(losses, reference)) < 1e-5


def test_world_size_mismatch_is_explained(tmp_path):
    """A 2-process program started as `python train.py` (one process): one line saying what to run
    and status 1, not a traceback (what running.md's reader met trying the compiled program)."""
    from planc.cli import main

    plan = tmp_path / "two.plan"
    plan.write_text(
        "model { layers = 2  hidden = 32  heads = 4  vocab = 64  seq_len = 16 }\n"
        'hardware { device = "cpu"  per_node = 2 }\n'
        "train { global_batch = 4  precision = fp32  steps = 3 }\n"
        "layout { tp = 1  pp = 1  dp = 2  zero = 0 }\n"
    )
    assert main(["compile", str(plan), "-o", str(tmp_path / "train.py")]) == 0
    done = subprocess.run(
        [sys.executable, str(tmp_path / "train.py"), "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    # 2 = tp 1 x pp 1 x dp 2 processes asked for; 1 started
    assert "tp x pp x dp = 1 x 1 x 2 = 2 processes, but this run has 1" in done.stderr
    assert "torchrun --nproc-per-node 2" in done.stderr


INTERRUPTIBLE = """
import json, sys
from planc.runtime.compose import compose
from planc.runtime.loop import shutdown, train
from planc.spec import Layout, build_plan
from planc.strategies.registry import load_registry
plan = build_plan(json.loads(sys.argv[1]))
job = compose(plan, Layout(tp=1, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=4), load_registry())
try:
    records = train(job, out_dir=sys.argv[2])
    print("finished", len(records), flush=True)
finally:
    shutdown()
"""


def interrupt_run(plan: dict, out_dir) -> tuple[int, str]:
    """Start a long single-process run, Ctrl-C it after step 2, return (the step it stopped at, stdout)."""
    import signal
    import threading

    plan = {**plan, "train": {**plan["train"], "steps": 100000}}  # long: it only ends by Ctrl-C
    process = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTIBLE, json.dumps(plan), str(out_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    timer = threading.Timer(120, process.kill)  # never hang the suite
    timer.start()
    try:
        for line in process.stdout:  # wait until training has started ("step      2/100000 | loss ...")
            if line.split("/")[0].split() == ["step", "2"]:
                break
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        timer.cancel()
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err[-2000:]
    stopped = int(out.split("interrupted after step ")[1].split(";")[0])
    assert f"finished {stopped}" in out
    return stopped, out


def test_ctrl_c_finishes_the_step_and_stops(tmp_path):
    stopped, out = interrupt_run(PLAN, tmp_path)
    assert "saving" not in out  # the plan has no checkpoint block
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == stopped and json.loads(lines[-1])["step"] == stopped


def test_ctrl_c_saves_a_checkpoint_to_resume_from(tmp_path):
    from planc.runtime.checkpoint import complete_steps

    plan = {**PLAN, "checkpoint": {"every": 100000, "dir": "ck"}}
    stopped, out = interrupt_run(plan, tmp_path)
    assert "saving a checkpoint" in out
    assert complete_steps(tmp_path / "ck") == [stopped]
