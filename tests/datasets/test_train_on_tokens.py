"""End to end on CPU processes: prepared token files train a Llama-shaped model; the validation loss is
logged (metrics.jsonl and TensorBoard) and falls; every layout sees the same token batches.

Both compare against the single-process reference trainer (:func:`planc.runtime.reference.train_reference`),
which reads the same files in the same order and computes the validation loss its own way (each
whole batch in one forward), so a layout that read other windows, or evaluated other rows, fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ranks import run_ranks
from test_sinks import read_scalars

from planc.dsl import load_plan
from planc.runtime.reference import train_reference
from planc.spec import Layout, build_plan
from planc.strategies.registry import load_registry

pytestmark = pytest.mark.dist

ROOT = Path(__file__).resolve().parents[2]
FP32_TOLERANCE = 1e-5

LLAMA_PLAN = """\
# A Llama-shaped model (SwiGLU, RMSNorm, RoPE, grouped-query attention) on planc prepare's files.
model "tiny-llama" {
  layers   = 2
  hidden   = 64
  heads    = 4
  kv_heads = 2
  vocab    = 512
  seq_len  = 32
  mlp      = swiglu
  norm     = rmsnorm
  position = rope
}
hardware { device = "cpu"  per_node = 2 }
train {
  global_batch = 16
  precision    = fp32
  lr           = 3e-3
  min_lr       = 3e-4
  warmup_steps = 3
  steps        = 24
  data         = "tokens/train.bin"
  val_data     = "tokens/val.bin"
  eval_every   = 8
  eval_batches = 2
  log          = [tensorboard]
}
"""


def test_prepared_tokens_train_on_two_processes_with_a_falling_validation_loss(prepared, tmp_path):
    shutil.copytree(prepared, tmp_path / "tokens")
    (tmp_path / "tiny-llama.plan").write_text(LLAMA_PLAN)
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "planc.cli", "run", "tiny-llama.plan", "--out", str(run_dir)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val = {r["step"]: r["val_loss"] for r in records if "val_loss" in r}
    assert list(val) == [8, 16, 24]  # every eval_every steps, and the last
    assert val[24] < val[8] - 0.2  # it learns something that carries to held-out text
    assert " | val " in done.stdout and " left" in done.stdout

    # The same numbers as one process training the same plan on the same files.
    reference = train_reference(load_plan(tmp_path / "tiny-llama.plan", strategies=load_registry()))
    assert max(abs(r["loss"] - ref) for r, ref in zip(records, reference.losses)) < FP32_TOLERANCE
    assert max(abs(val[step] - reference.val_losses[step]) for step in val) < FP32_TOLERANCE

    # TensorBoard's reader finds the validation curve the run logged.
    scalars = read_scalars(run_dir / "tensorboard")
    assert [step for step, _ in scalars["val/loss"]] == [8, 16, 24]
    assert all(abs(value - val[step]) < 1e-5 for step, value in scalars["val/loss"])  # stored as float32
    assert json.loads((run_dir / "data.json").read_text())["train.data"]["path"] == str(
        (tmp_path / "tokens" / "train.bin").resolve()
    )


LAYOUTS = {
    "dp2-ddp-accum": dict(dp=2, micro_batch=2),
    "tp2-sp": dict(tp=2, sequence_parallel=True),
    "pp2-1f1b": dict(pp=2, schedule="1f1b", micro_batch=2),
    "dp2-zero3": dict(dp=2, zero=3),
    "pp2-zero-bubble": dict(pp=2, schedule="zero-bubble", virtual_stages=2, micro_batch=2),
}


def test_every_layout_reads_the_same_token_batches(prepared, tmp_path):
    plan = build_plan(
        {
            "model": dict(
                layers=4, hidden=32, heads=4, kv_heads=2, vocab=512, seq_len=16, mlp="swiglu", norm="rmsnorm"
            ),
            "hardware": {"device": "cpu", "per_node": 2},
            "train": dict(
                global_batch=8,
                precision="fp32",
                lr=1e-2,
                warmup_steps=1,
                steps=4,
                seed=3,
                data=str(prepared / "train.bin"),
                val_data=str(prepared / "val.bin"),
                eval_every=2,
                eval_batches=1,
            ),
        }
    )
    base = dict(tp=1, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=4)
    cases = [
        {"name": name, "plan": plan.model_dump(mode="json"), "layout": {**base, **layout}, "steps": 4}
        for name, layout in LAYOUTS.items()
    ]
    for case in cases:
        Layout(**case["layout"])  # a typo in LAYOUTS fails here, not in a worker
    results = run_ranks("tests/distributed/runner.py:run_cases", 2, cases)
    reference = train_reference(plan)
    for name in LAYOUTS:
        result = results[name]
        assert "error" not in result, result.get("error")
        assert max(abs(a - b) for a, b in zip(result["losses"], reference.losses)) < FP32_TOLERANCE, name
        val = {int(step): loss for step, loss in result["val_losses"].items()}
        assert list(val) == [2, 4], name
        assert max(abs(val[s] - reference.val_losses[s]) for s in val) < FP32_TOLERANCE, name
