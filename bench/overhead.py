"""Is the emitted program as fast as hand-written PyTorch? DDP, FSDP, TP and PP side by side, one run.

    python bench/overhead.py [--strategy ddp --strategy pp] [--steps N] [--rounds R] [--procs P]

For each strategy it fixes a layout of one plan (the model of plans/tiny-cpu.plan: 4 blocks,
hidden 128, 128 tokens; fp32; P CPU processes over gloo): DDP (dp = P), FSDP / ZeRO-3 (dp = P),
TP (tp = P) and PP (pp = P, 1F1B, 4 micro-batches). It then runs, alternately R times each,
(a) the program ``planc compile`` emits for that plan, under torchrun, and (b) bench/handwritten.py,
the minimal script an engineer would write for the same strategy with the same model code, data
and optimizer. Step time is wall time per step — for planc the gap between consecutive
``elapsed_s`` in metrics.jsonl, so logging, interrupt checks and metrics writing are inside it —
with the first :data:`WARMUP` steps of a run dropped. Prints the median per program and the ratio
planc / hand-written per strategy (the goal is at most 1.03), and the load average: the machine is
shared, so compare ratios of one run, never absolute times across runs.
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
STRATEGIES = ("ddp", "fsdp", "tp", "pp")


PLAN = """model "overhead" {{
  layers = 4
  hidden = 128
  heads = 4
  vocab = 256
  seq_len = 128
  mlp = gelu
  norm = layernorm
  position = learned
}}
hardware {{
  device = "cpu"
  per_node = {procs}
}}
train {{
  global_batch = 8
  micro_batch = {micro_batch}
  precision = fp32
  lr = 3e-3
  warmup_steps = 1
  steps = {steps}
  seed = 0
}}
layout {{
  tp = {tp}
  pp = {pp}
  dp = {dp}
  zero = {zero}
  recompute = none
  sequence_parallel = false
  {schedule}
}}
"""


def plan_text(strategy: str, procs: int, steps: int) -> str:
    """The plan of one strategy: every layout key fixed, one micro-batch per data-parallel rank (PP: 4)."""
    layout = {"tp": 1, "pp": 1, "dp": 1, "zero": 0, "schedule": ""}
    layout.update(
        {
            "ddp": {"dp": procs},
            "fsdp": {"dp": procs, "zero": 3},
            "tp": {"tp": procs},
            "pp": {"pp": procs, "schedule": "schedule = 1f1b"},
        }[strategy]
    )
    micro_batch = 2 if strategy == "pp" else 8 // layout["dp"]
    return PLAN.format(procs=procs, steps=steps, micro_batch=micro_batch, **layout)


def plan_json(plan_path: Path) -> Path:
    """The validated plan as JSON (what the hand-written scripts read)."""
    out = plan_path.with_suffix(".json")
    command = [sys.executable, "-m", "planc", "check", "--json", str(plan_path)]
    out.write_text(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    return out


def run_planc(plan_path: Path, procs: int, steps: int, work: Path) -> list[float]:
    out = work / "planc"
    out.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "planc", "compile", str(plan_path), "-o", str(out / "train.py")]
    subprocess.run(command, check=True, capture_output=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs)]
    subprocess.run(
        [*launch, "train.py", "--steps", str(steps), "--out", "."],
        cwd=out,
        check=True,
        capture_output=True,
        env=_env(procs),
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    elapsed = [r["elapsed_s"] for r in records]
    return [b - a for a, b in zip(elapsed, elapsed[1:])][WARMUP:]


def run_handwritten(strategy: str, plan_path: Path, procs: int, steps: int, work: Path) -> list[float]:
    result = work / "handwritten.json"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs)]
    script = [str(ROOT / "bench" / "handwritten.py"), strategy, str(plan_path), str(steps), str(result)]
    subprocess.run([*launch, *script], check=True, capture_output=True, env=_env(procs))
    return json.loads(result.read_text())["step_s"][WARMUP + 1 :]


def _env(processes: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // processes))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", action="append", choices=STRATEGIES)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for strategy in args.strategy or STRATEGIES:
            plan_path = work / f"{strategy}.plan"
            plan_path.write_text(plan_text(strategy, args.procs, args.steps))
            plan_file = plan_json(plan_path)
            planc_times, hand_times = [], []
            for _ in range(args.rounds):  # alternate, so drifting machine load hits both alike
                planc_times += run_planc(plan_path, args.procs, args.steps, work)
                hand_times += run_handwritten(strategy, plan_file, args.procs, args.steps, work)
            rows.append((strategy, statistics.median(planc_times), statistics.median(hand_times)))
            print(f"{strategy}: planc {rows[-1][1] * 1e3:.1f} ms, hand-written {rows[-1][2] * 1e3:.1f} ms", flush=True)
    print(
        f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores; "
        f"{args.procs} processes, {args.steps} steps x {args.rounds} rounds, first {WARMUP} dropped"
    )
    print("| strategy | planc step | hand-written step | ratio planc / hand-written |")
    print("|---|---:|---:|---:|")
    for strategy, planc, hand in rows:
        print(f"| {strategy} | {planc * 1e3:.1f} ms | {hand * 1e3:.1f} ms | {planc / hand:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
