"""Cost-model accuracy against Narayanan et al. 2021, Table 1 (tests/data/megatron_table1.json).

    python bench/cost_accuracy.py

For every row: the published layout fixed in a plan (full recomputation, interleaved schedule
when p > 1), micro-batch and virtual stages searched by the planner (tolerance 0), the program
described by the MEGATRON_LM_2021 profile. Predicted TFLOP/s per GPU use the paper's own count,
F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) (includes the recomputed forward), over the predicted
step time. The last column is what planc's own runtime (PyTorch eager, SDPA) is predicted to do
with the same layout constraints.
"""

from __future__ import annotations

import json
from pathlib import Path

from planc.cost import MEGATRON_LM_2021, PLANC_RUNTIME
from planc.cost.flops import narayanan_eq3
from planc.planner import choose
from planc.spec import build_plan
from planc.strategies.registry import load_registry

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "megatron_table1.json"


def plan_for(row: dict):
    return build_plan(
        {
            "model": {k: row[k] for k in ("layers", "hidden", "heads", "ffn", "vocab", "seq_len")},
            "hardware": {"device": "A100-80GB", "nodes": row["gpus"] // 8, "per_node": 8},
            "train": {"global_batch": row["global_batch"], "optimizer": "adam"},
            "layout": {
                "tp": row["tp"],
                "pp": row["pp"],
                "dp": row["dp"],
                "zero": 0,
                "recompute": "full",
                "sequence_parallel": False,
                **({"schedule": "interleaved"} if row["pp"] > 1 else {}),
            },
        }
    )


def main() -> None:
    rows = json.loads(DATA.read_text())["rows"]
    print(
        f"{'model':<8}{'GPUs':>6}{'t,p,d':>12}{'published':>11}{'predicted':>11}{'error':>8}"
        f"{'mb':>4}{'v':>3}{'GB':>7}{'planc rt':>10}"
    )
    worst = 0.0
    for row in rows:
        plan = plan_for(row)
        flops = narayanan_eq3(row["global_batch"], row["seq_len"], row["layers"], row["hidden"], row["vocab"])
        c = choose(plan, load_registry(), tolerance=0.0, profile=MEGATRON_LM_2021)
        tf = flops / c.estimate.step_s / row["gpus"] / 1e12
        own = choose(plan, load_registry(), tolerance=0.0, profile=PLANC_RUNTIME)
        own_tf = f"{flops / own.estimate.step_s / row['gpus'] / 1e12:.0f}" if own.fits else "no fit"
        err = tf / row["tflops_per_gpu"] - 1
        worst = max(worst, abs(err))
        tpd = f"{row['tp']},{row['pp']},{row['dp']}"
        print(
            f"{row['params'] / 1e9:>6.1f}B{row['gpus']:>6}{tpd:>12}"
            f"{row['tflops_per_gpu']:>11}{tf:>11.1f}{err:>+8.1%}{c.layout.micro_batch:>4}"
            f"{c.layout.virtual_stages:>3}{c.estimate.memory_bytes / 1e9:>7.1f}{own_tf:>10}"
        )
    print(f"largest error {worst:.1%} (tolerance 15%)")


if __name__ == "__main__":
    main()
