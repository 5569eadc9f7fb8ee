"""`planc explain --runtime megatron-lm-2021`: a published Megatron-LM run, written as a .plan
file with its layout fixed, is predicted through the CLI as the paper measured it.

Rows: Narayanan et al. 2021, Table 1 (tests/data/megatron_table1.json). FLOP convention theirs:
F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per step, which counts the recomputed forward, divided
by the predicted step time. Micro-batch and virtual stages are left auto (not in the table).
"""

import contextlib
import io
import json
from pathlib import Path

import pytest

from planc.cli import main

ROWS = json.loads((Path(__file__).resolve().parent.parent / "data" / "megatron_table1.json").read_text())["rows"]


def plan_text(row: dict) -> str:
    schedule = "  schedule = interleaved" if row["pp"] > 1 else ""
    return f"""model "{row["id"]}" {{
  layers = {row["layers"]}  hidden = {row["hidden"]}  heads = {row["heads"]}  ffn = {row["ffn"]}
  vocab = {row["vocab"]}  seq_len = {row["seq_len"]}
}}
hardware {{ device = "A100-80GB"  nodes = {row["gpus"] // 8}  per_node = 8  inter_node_bw = 200 Gb/s }}
train {{ global_batch = {row["global_batch"]}  precision = bf16  optimizer = adam }}
layout {{ tp = {row["tp"]}  pp = {row["pp"]}  dp = {row["dp"]}  zero = 0  recompute = full{schedule} }}
"""


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_published_run_through_the_cli(row, tmp_path):
    path = tmp_path / "run.plan"
    path.write_text(plan_text(row))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["explain", "--json", "--runtime", "megatron-lm-2021", str(path)])
    result = json.loads(out.getvalue())
    assert code == 0 and result["fits"] and result["runtime"] == "megatron-lm-2021"
    b, s, l, h, V = row["global_batch"], row["seq_len"], row["layers"], row["hidden"], row["vocab"]
    flops = 96 * b * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    tflops = flops / result["time"]["step_s"] / row["gpus"] / 1e12
    assert tflops == pytest.approx(row["tflops_per_gpu"], rel=0.15)


def test_unknown_runtime_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "run.plan"
    path.write_text(plan_text(ROWS[0]))
    assert main(["explain", "--runtime", "megatron", str(path)]) == 1
    assert "did you mean 'megatron-lm-2021' or 'megatron-core-2024'?" in capsys.readouterr().err  # both start so


def test_a_gpu_runtime_on_a_cpu_plan_is_warned_about(capsys):
    cpu_plan = str(Path(__file__).resolve().parents[2] / "plans" / "tiny-cpu.plan")
    assert main(["explain", "--runtime", "megatron-core-2024", cpu_plan]) == 0
    err = capsys.readouterr().err
    assert "warning: --runtime megatron-core-2024 describes Megatron-Core 2024" in err
    assert 'device = "cpu"' in err
    assert main(["explain", cpu_plan]) == 0
    assert "warning" not in capsys.readouterr().err  # planc's own program runs on CPU
