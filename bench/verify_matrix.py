"""`planc verify` over the CPU matrix: predicted vs measured for DDP, ZeRO-1/2/3, TP, TP+SP and PP.

    python bench/verify_matrix.py            # every case (2 CPU processes each, HSDP 4), then the table
    python bench/verify_matrix.py --case tp  # one case

Each case is a tiny plan (2 layers, hidden 128, 4 heads, sequence 64; 4 layers for the schedules
with two chunks per rank) on 2 CPU processes (HSDP on 4) with one dimension of parallelism fixed;
the script runs ``planc verify --json`` on it and prints the worst relative error (predicted /
measured - 1) over its ranks of each quantity, beside the goals of issue 13: model states 1%,
saved activations 10%, communication 2%. Peak memory and step time are printed for information
(the CPU device has no calibration here; the peak is torch's MemTracker's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

MODEL = """model "tiny" {
  layers  = 2
  hidden  = 128
  heads   = 4
  vocab   = 256
  seq_len = 64
}
hardware {
  device   = "cpu"
  nodes    = 1
  per_node = 2
}
"""

#: case -> (train block, layout block)
CASES = {
    "ddp": ("precision = fp32", "tp = 1  pp = 1  dp = 2  zero = 0"),
    "zero1": ("precision = fp32", "tp = 1  pp = 1  dp = 2  zero = 1"),
    "zero2": ("precision = fp32", "tp = 1  pp = 1  dp = 2  zero = 2"),
    "zero3": ("precision = fp32", "tp = 1  pp = 1  dp = 2  zero = 3"),
    "zero3-bf16": ("precision = bf16", "tp = 1  pp = 1  dp = 2  zero = 3"),
    "tp": ("precision = fp32", "tp = 2  pp = 1  dp = 1  sequence_parallel = false"),
    "tp-sp": ("precision = fp32", "tp = 2  pp = 1  dp = 1  sequence_parallel = true"),
    "pp": ("precision = fp32", "tp = 1  pp = 2  dp = 1  schedule = 1f1b"),
    # the first and the last stage sum the tied embedding's gradient over a group of their own
    "pp-tied": ("precision = fp32", "tp = 1  pp = 2  dp = 1  schedule = 1f1b"),
    "pp-interleaved": ("precision = fp32", "tp = 1  pp = 2  dp = 1  schedule = interleaved  virtual_stages = 2"),
    "pp-zero-bubble": ("precision = fp32", "tp = 1  pp = 2  dp = 1  schedule = zero-bubble  virtual_stages = 2"),
    # one micro-batch per step (global batch 4 on 2 ranks): no gradient yet at the forward's end
    "zero3-one-micro-batch": ("precision = fp32", "tp = 1  pp = 1  dp = 2  zero = 3"),
    # 4 processes: shard groups of 2, replicated twice
    "hsdp": ("precision = fp32", "tp = 1  pp = 1  dp = 4  zero = 3  shard_group = 2"),
}
#: case -> blocks (default 2): two chunks of one block on each of the 2 pipeline ranks
LAYERS = {"pp-interleaved": 4, "pp-zero-bubble": 4}
#: case -> processes (default 2)
PROCESSES = {"hsdp": 4}
#: case -> global batch (default 8)
GLOBAL_BATCH = {"zero3-one-micro-batch": 4}
#: case -> a line added to the model block
MODEL_EXTRA = {"pp-tied": "  tie_embeddings = true\n"}
#: case -> a block added to the plan: a third-party strategy (plugins/planc-powersgd), where installed;
#: verify runs its uncompressed first start_iter steps unmeasured (its steady_after)
PLAN_EXTRA = {"ddp-powersgd": "use powersgd {\n  rank = 4\n}\n"}
if find_spec("planc_powersgd") is not None:
    CASES["ddp-powersgd"] = CASES["ddp"]
SECTIONS = ("model states", "saved activations", "communication", "peak memory", "step time")
GOALS = {"model states": 0.01, "saved activations": 0.10, "communication": 0.02}


def plan_text(case: str) -> str:
    train, layout = CASES[case]
    model = (
        MODEL.replace("}", MODEL_EXTRA.get(case, "") + "}", 1)
        .replace("per_node = 2", f"per_node = {PROCESSES.get(case, 2)}")
        .replace("layers  = 2", f"layers  = {LAYERS.get(case, 2)}")
    )
    batch = GLOBAL_BATCH.get(case, 8)
    return (
        model
        + f"train {{\n  global_batch = {batch}\n  micro_batch = 2\n  {train}\n  steps = 20\n}}\n"
        + f"layout {{\n  {layout}  recompute = none\n}}\n"
        + PLAN_EXTRA.get(case, "")
    )


def run_case(case: str, folder: Path) -> dict:
    plan = folder / f"{case}.plan"
    plan.write_text(plan_text(case))
    env = {**os.environ, "PLANC_VERIFY_DIR": str(folder / "results")}
    done = subprocess.run(
        [sys.executable, "-m", "planc.cli", "verify", str(plan), "--json", "--out", str(folder / case)],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        raise SystemExit(f"{case}: planc verify failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def worst(result: dict) -> dict[str, float]:
    errors: dict[str, float] = {}
    for row in result["rows"]:
        if row["error"] is None:
            continue
        section = row["section"]
        if abs(row["error"]) >= abs(errors.get(section, 0.0)):
            errors[section] = row["error"]
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="run only this case (repeatable)")
    args = parser.parse_args()
    cases = args.case or list(CASES)
    with tempfile.TemporaryDirectory() as tmp:
        table = {case: worst(run_case(case, Path(tmp))) for case in cases}
    width = max(len(case) for case in [*cases, "case"]) + 2
    print(f"{'case':<{width}}" + "".join(f"{s:>20}" for s in SECTIONS))
    for case, errors in table.items():
        cells = "".join(f"{(f'{errors[s]:+.1%}' if s in errors else '-'):>20}" for s in SECTIONS)
        print(f"{case:<{width}}{cells}")
    print(f"{'goal':<{width}}" + "".join(f"{(f'±{GOALS[s]:.0%}' if s in GOALS else '-'):>20}" for s in SECTIONS))
    print("worst error over the ranks; error = predicted / measured - 1; load:", os.getloadavg()[0])


if __name__ == "__main__":
    main()
