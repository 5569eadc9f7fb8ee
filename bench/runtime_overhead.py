"""Is the emitted program as fast as hand-written PyTorch? Side by side, same machine, same job.

    python bench/runtime_overhead.py [PLAN] [--steps N] [--rounds R]

Runs, alternately R times each, (a) the program `planc compile` emits for PLAN (default
plans/tiny-cpu.plan, DDP on 4 CPU processes) and (b) bench/handwritten_ddp.py, a plain PyTorch
DDP loop over the same model and data. Prints the median step time of each (first 3 steps of a
run dropped as warm-up) and their ratio. The plan must be a pure data-parallel DDP plan.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 3


def run_planc(plan_path: Path, steps: int, work: Path) -> list[float]:
    out = work / "planc"
    out.mkdir(exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "planc", "compile", str(plan_path), "-o", str(out / "train.py")],
        check=True,
        capture_output=True,
    )
    (out / "metrics.jsonl").unlink(missing_ok=True)
    per_node = json.loads(
        subprocess.run(
            [sys.executable, "-m", "planc", "check", "--json", str(plan_path)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )["hardware"]["per_node"]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(per_node),
            "train.py",
            "--steps",
            str(steps),
            "--out",
            ".",
        ],
        cwd=out,
        check=True,
        capture_output=True,
        env=_env(per_node),
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["step_s"] for r in records][WARMUP:]


def run_handwritten(plan_path: Path, steps: int, work: Path) -> list[float]:
    plan_json = work / "plan.json"
    plan_json.write_text(
        subprocess.run(
            [sys.executable, "-m", "planc", "check", "--json", str(plan_path)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    per_node = json.loads(plan_json.read_text())["hardware"]["per_node"]
    result = work / "handwritten.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(per_node),
            str(ROOT / "bench" / "handwritten_ddp.py"),
            str(plan_json),
            str(steps),
            str(result),
        ],
        check=True,
        capture_output=True,
        env=_env(per_node),
    )
    return json.loads(result.read_text())["step_s"][WARMUP:]


def _env(processes: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // processes))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan", nargs="?", default=str(ROOT / "plans" / "tiny-cpu.plan"))
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    planc_times, hand_times = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for _ in range(args.rounds):  # alternate, so drifting machine load hits both alike
            planc_times += run_planc(Path(args.plan), args.steps, work)
            hand_times += run_handwritten(Path(args.plan), args.steps, work)
    planc_median, hand_median = statistics.median(planc_times), statistics.median(hand_times)
    print(f"plan: {args.plan}  ({len(planc_times)} + {len(hand_times)} timed steps)")
    print(f"{'program':<28}{'median step s':>15}")
    print(f"{'planc emitted program':<28}{planc_median:>15.4f}")
    print(f"{'hand-written PyTorch DDP':<28}{hand_median:>15.4f}")
    print(f"ratio planc / hand-written: {planc_median / hand_median:.3f}")


if __name__ == "__main__":
    main()
