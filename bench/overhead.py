"""Is the emitted program as fast as hand-written PyTorch? DDP, FSDP, TP and PP side by side, one run.

    python bench/overhead.py [--strategy ddp --strategy pp] [--steps N] [--rounds R] [--procs P]

For each strategy it fixes a layout of one plan (the model of plans/tiny-cpu.plan: 4 blocks,
hidden 128, 128 tokens; fp32; P CPU processes over gloo): DDP (dp = P), FSDP / ZeRO-3 (dp = P),
TP (tp = P) and PP (pp = P, 1F1B, 4 micro-batches). It then runs, R rounds each, (a) the program
``planc compile`` emits for that plan, under torchrun, and (b) bench/handwritten.py, the minimal
script an engineer would write for the same strategy with the same model code, data and
optimizer. The order alternates (a b, b a, a b, ...), so load that drifts during a round hits
both alike.

One definition of a step for both: the gap between the ends of consecutive steps on rank 0, a
whole loop iteration (for planc its heartbeat, logging, stop vote and metrics writing are inside
it; bench/step_stamps.py stamps the emitted program where its loop takes ``elapsed_s``), with the
first :data:`WARMUP` steps of a launch dropped. Two clocks: wall time, and the CPU time of rank 0's
process (``time.process_time()``: the work the process itself did, which the other sessions of a
shared machine disturb far less; time spent waiting in a collective is not in it). Printed per
strategy and clock: each program's median with its interquartile range; the ratio of the medians;
and the median and range of the R per-round ratios (each a pair of launches run back to back).
Also, measured inside planc's own process, the loop's time per step outside ``train_step`` (wall
gap minus the record's ``step_s``). The goal is a ratio of at most 1.03. The load average before and
after is printed: the machine is shared, so compare ratios of one run, never times across runs.
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
CLOCKS = ("wall", "cpu")


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


def run_planc(plan_path: Path, procs: int, steps: int, work: Path) -> dict[str, list[float]]:
    """One launch of the emitted program: per-step wall and CPU gaps, and the loop outside ``train_step``."""
    out = work / "planc"
    out.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "planc", "compile", str(plan_path), "-o", str(out / "train.py")]
    subprocess.run(command, check=True, capture_output=True)
    (out / "metrics.jsonl").unlink(missing_ok=True)
    stamps = work / "planc-stamps.json"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs)]
    program = [str(ROOT / "bench" / "step_stamps.py"), str(stamps), "train.py", "--steps", str(steps), "--out", "."]
    subprocess.run([*launch, *program], cwd=out, check=True, capture_output=True, env=_env(procs))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    result = _gaps(json.loads(stamps.read_text()))
    inner = [r["step_s"] for r in records[1:]][WARMUP:]
    result["loop"] = [gap - step for gap, step in zip(result["wall"], inner)]
    return result


def run_handwritten(strategy: str, plan_path: Path, procs: int, steps: int, work: Path) -> dict[str, list[float]]:
    """One launch of bench/handwritten.py: per-step wall and CPU gaps."""
    result = work / "handwritten.json"
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs)]
    script = [str(ROOT / "bench" / "handwritten.py"), strategy, str(plan_path), str(steps), str(result)]
    subprocess.run([*launch, *script], check=True, capture_output=True, env=_env(procs))
    return _gaps(json.loads(result.read_text()))


def _gaps(stamps: dict[str, list[float]]) -> dict[str, list[float]]:
    """Gaps between consecutive step ends, per clock, the first WARMUP dropped."""
    return {
        clock: [b - a for a, b in zip(ends, ends[1:])][WARMUP:]
        for clock, ends in (("wall", stamps["wall_s"]), ("cpu", stamps["cpu_s"]))
    }


def measure(strategy: str, plan_path: Path, plan_file: Path, args, work: Path) -> dict:
    """R rounds of one strategy, alternating which program goes first."""
    runs: dict[str, list[dict]] = {"planc": [], "hand": []}
    for index in range(args.rounds):
        for which in ("planc", "hand") if index % 2 == 0 else ("hand", "planc"):
            if which == "planc":
                runs["planc"].append(run_planc(plan_path, args.procs, args.steps, work))
            else:
                runs["hand"].append(run_handwritten(strategy, plan_file, args.procs, args.steps, work))
    result: dict = {"loop": [x for run in runs["planc"] for x in run["loop"]]}
    for clock in CLOCKS:
        planc_rounds = [run[clock] for run in runs["planc"]]
        hand_rounds = [run[clock] for run in runs["hand"]]
        result[clock] = {
            "planc": [x for r in planc_rounds for x in r],
            "hand": [x for r in hand_rounds for x in r],
            "round_ratios": [statistics.median(a) / statistics.median(b) for a, b in zip(planc_rounds, hand_rounds)],
        }
    return result


def _ms(values: list[float]) -> str:
    """``median [q1-q3]`` of step times, in ms."""
    q1, median, q3 = statistics.quantiles(values, n=4)
    return f"{median * 1e3:.1f} [{q1 * 1e3:.1f}-{q3 * 1e3:.1f}]"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _env(processes: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // processes))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", action="append", choices=STRATEGIES)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--procs", type=int, default=2)
    args = parser.parse_args(argv)
    load_before = _load()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for strategy in args.strategy or STRATEGIES:
            plan_path = work / f"{strategy}.plan"
            plan_path.write_text(plan_text(strategy, args.procs, args.steps))
            rows[strategy] = r = measure(strategy, plan_path, plan_json(plan_path), args, work)
            print(
                f"{strategy}: wall planc {_ms(r['wall']['planc'])}, hand-written {_ms(r['wall']['hand'])} ms",
                flush=True,
            )
    print(
        f"\nload average {load_before} before, {_load()} after, on {os.cpu_count()} cores; "
        f"{args.procs} processes, {args.steps} steps x {args.rounds} rounds, first {WARMUP} dropped; "
        "step times in ms as median [q1-q3]"
    )
    print(
        "| strategy | clock | planc step | hand-written step | ratio of medians "
        "| per-round ratios, median [range] | planc loop outside train_step |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for strategy, r in rows.items():
        loop = f"{statistics.median(r['loop']) * 1e3:.2f} ms"
        for clock in CLOCKS:
            c = r[clock]
            ratios = c["round_ratios"]
            print(
                f"| {strategy} | {clock} | {_ms(c['planc'])} | {_ms(c['hand'])} | "
                f"{statistics.median(c['planc']) / statistics.median(c['hand']):.3f} | "
                f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}] | "
                f"{loop if clock == 'wall' else ''} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
