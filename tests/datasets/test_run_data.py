"""Run time, one process (a process group of one): where data paths resolve, what a run directory
records, and the one-line stops for missing data and for ids beyond the vocabulary."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from planc.spec import build_plan

pytestmark = pytest.mark.dist  # each test starts a training process

SCRIPT = """
import json, sys
from planc.runtime.compose import compose
from planc.runtime.loop import shutdown, train
from planc.spec import Layout, Plan
from planc.strategies.registry import load_registry
plan = Plan.model_validate(json.loads(sys.argv[1]))
job = compose(plan, Layout(tp=1, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=4), load_registry())
try:
    records = train(job, quiet=True, **json.loads(sys.argv[2]))
    print(json.dumps([r["loss"] for r in records]))
finally:
    shutdown()
"""


def plan_with(data: str, *, root=None, steps: int = 2) -> dict:
    model = {"layers": 1, "hidden": 32, "heads": 4, "vocab": 512, "seq_len": 16, "vocab_multiple": 32}
    plan = build_plan(
        {
            "model": model,
            "hardware": {"device": "cpu", "per_node": 1},
            "train": {"global_batch": 4, "precision": "fp32", "steps": steps, "min_lr": 1e-4},
        }
    ).model_dump(mode="json")
    plan["train"]["data"], plan["data_root"] = data, root  # as a checked plan carries them
    return plan


def train_in_process(plan: dict, **options) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(plan), json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_relative_paths_follow_the_data_root_and_the_run_records_them(prepared, tmp_path):
    compiled_here, nodes_copy = tmp_path / "laptop", tmp_path / "node"
    shutil.copytree(prepared, nodes_copy / "tokens")
    plan = plan_with("tokens/train.bin", root=str(compiled_here))  # checked where the data no longer is

    missing = train_in_process(plan)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "rank 0 on " in missing.stderr
    assert f"train.data: no such token file: {compiled_here}/tokens" in missing.stderr

    # On the node: the plan's relative path under --data-root, validation data named outright, and one
    # step past the plan's schedule (min_lr > 0: trained, with a warning).
    val = nodes_copy / "tokens" / "val.bin"
    moved = train_in_process(plan, data_dir=str(nodes_copy), val_data=str(val), steps=3, out_dir=str(tmp_path / "run"))
    assert moved.returncode == 0, moved.stderr[-2000:]
    assert "warning: steps 3..3 train at the constant min_lr = 0.0001" in moved.stderr
    recorded = json.loads((tmp_path / "run" / "data.json").read_text())
    assert recorded["train.data"]["path"] == str((nodes_copy / "tokens" / "train.bin").resolve())
    assert recorded["train.data"]["tokens"] == (nodes_copy / "tokens/train.bin").stat().st_size // 2  # uint16
    assert recorded["train.val_data"]["path"] == str(val.resolve())
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_loss" in r] == [3]  # the last step evaluates


def test_an_id_beyond_the_vocabulary_found_mid_run_stops_with_one_line(tmp_path):
    ids = np.zeros(16 * 40 + 1, dtype=np.uint16)
    ids[16 * 30 :] = 700  # windows 30.. hold id 700; with 4 rows a step, some step reaches them
    ids.tofile(tmp_path / "big.bin")  # headerless, never scanned here: only the run can see it
    done = train_in_process(plan_with(str(tmp_path / "big.bin"), steps=10))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "planc: train.data: " in done.stderr and "holds token id 700 (in the batch of step " in done.stderr
    assert "but model.vocab = 512" in done.stderr
