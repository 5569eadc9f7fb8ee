"""Run equivalence cases under torchrun and write each case's per-step losses as JSON.

    torchrun --standalone --nproc-per-node N tests/dist/runner.py CASES.json RESULTS.json

``CASES.json`` is a list of ``{"name", "plan" (Plan JSON), "layout" (Layout fields), "steps"}``;
every case must have ``tp x pp x dp = N``. Each case builds its own job (and device mesh) through
:func:`planc.runtime.compose.compose` -- the registry's active strategies in composition order --
and trains it. Rank 0 writes ``{name: {"losses": [...], "grad_norms": [...], "seconds": s}}``,
or ``{"error": "..."}`` for a case that raised (the others still run).
"""

from __future__ import annotations

import json
import sys
import time
import traceback

import torch.distributed as dist

from planc.runtime.compose import compose
from planc.runtime.loop import shutdown, train
from planc.spec import Layout, Plan


def run_case(case: dict) -> dict:
    plan = Plan.model_validate(case["plan"])
    layout = Layout(**case["layout"])
    began = time.perf_counter()
    job = compose(plan, layout)
    records = train(job, steps=case["steps"], quiet=True)
    return {"losses": [r["loss"] for r in records], "grad_norms": [r["grad_norm"] for r in records],
            "seconds": time.perf_counter() - began}


def main(cases_path: str, results_path: str) -> int:
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    results = {}
    for case in cases:
        try:
            results[case["name"]] = run_case(case)
        except Exception as exc:  # report and go on: one broken case must not hide the others
            results[case["name"]] = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
            print(f"[rank {dist.get_rank() if dist.is_initialized() else 0}] case {case['name']} failed: "
                  f"{results[case['name']]['error']}",
                  file=sys.stderr, flush=True)
        if dist.is_initialized():
            dist.barrier()
    if not dist.is_initialized() or dist.get_rank() == 0:
        with open(results_path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
