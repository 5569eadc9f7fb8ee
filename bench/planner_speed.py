"""Planner speed: a full layout search for the two largest published configurations.

    python bench/planner_speed.py [--repeat N]

1. GPT 1T (Narayanan et al. 2021, Table 1, last row): 128 layers, h 25600, 160 heads,
   seq 2048, vocab 51200, global batch 3072, on 3072 A100-80GB (384 nodes x 8).
2. Llama 3 405B (Llama Team 2024, Table 3/4): the llama3-405b preset, seq 8192, global batch
   2048 sequences (16M tokens), on 16,384 H100 (2048 nodes x 8).

Goal: under 1 second each on one core, every layout key left auto. "cold" includes building
the hardware graph; "warm" reuses it (what `planc explain` pays is the cold number). Python runs
on one core; the numbers are wall-clock seconds of a single process.
"""

from __future__ import annotations

import argparse
import statistics
import time

from planc.hardware.topology import topology_for
from planc.planner import choose
from planc.spec import build_plan
from planc.strategies.registry import load_registry

CASES = {
    "GPT-1T on 3072 x A100-80GB": {
        "model": {
            "name": "gpt-1t",
            "layers": 128,
            "hidden": 25600,
            "heads": 160,
            "ffn": 102400,
            "vocab": 51200,
            "seq_len": 2048,
        },
        "hardware": {"device": "A100-80GB", "nodes": 384, "per_node": 8},
        "train": {"global_batch": 3072},
    },
    "llama3-405b on 16384 x H100": {
        "model": {"preset": "llama3-405b"},
        "hardware": {"device": "H100-SXM", "nodes": 2048, "per_node": 8},
        "train": {"global_batch": 2048},
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    goal = 1.0
    print(f"{'case':<30}{'cold s':>8}{'warm s':>8}{'scored':>8}{'layouts/s':>11}  goal {goal:.0f} s  chosen")
    for name, raw in CASES.items():
        plan = build_plan(raw)
        topology_for.cache_clear()
        t0 = time.perf_counter()
        choice = choose(plan, load_registry())
        cold = time.perf_counter() - t0
        warm = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            choice = choose(plan, load_registry())
            warm.append(time.perf_counter() - t0)
        w = statistics.median(warm)
        verdict = "ok" if cold < goal else "SLOW"
        print(
            f"{name:<30}{cold:>8.3f}{w:>8.3f}{choice.scored:>8}{choice.scored / w:>11.0f}  {verdict:<7} "
            f"{choice.layout.describe()}"
        )


if __name__ == "__main__":
    main()
