"""What PowerSGD's compression adds to a step, measured: the CPU matrix's ``powersgd-compressing``
case at several depths, with the hook compressing and not, side by side.

    python bench/powersgd_steps.py [--layers 2 4 8]

For each depth, one launch of 2 gloo ranks (tests/ranks.py) builds the case twice -- PowerSGD
from step 2 (compressing) and from step 1000 (the same hook, plain all-reduce) -- and runs them
in 4 alternating rounds of 6 steps. It prints the median step of each, the difference, the
all-reduces per step (``torch.distributed.all_reduce`` calls: the loss's and the hook's), and how
many matrices the hook compresses. The plugin's cost pass (plugins/planc-powersgd) cites it: on
2026-11-29 the difference grew with the compressed matrices (3.5, 5.8 and 7.5 ms at 15, 27 and 51:
about 0.11 ms per matrix, the hook's own ops, and 1.9 ms beside, its two chained all-reduce rounds
and their callbacks); an earlier session read it flat at 3.5-5.0 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASE = "powersgd-compressing"


def _job(layers: int, start_iter: int):
    from planc.runtime.compose import compose
    from planc.spec import Layout, Plan
    from planc.strategies.registry import load_registry
    from tests.distributed.cases import CASES

    case = next(c for c in CASES if c["name"] == CASE)
    plan = Plan.model_validate(case["plan"])
    uses = [
        u.model_copy(update={"options": {**u.options, "start_iter": start_iter}}) if u.name == "powersgd" else u
        for u in plan.uses
    ]
    plan = plan.model_copy(
        update={
            "uses": uses,
            "train": plan.train.model_copy(update={"steps": 1000}),
            "model": plan.model.model_copy(update={"layers": layers}),
        }
    )
    return compose(plan, Layout(**case["layout"].model_dump()), load_registry())


def worker(payload: dict) -> dict:
    """What each of the 2 ranks runs: both jobs, alternating; rank 0's medians come back."""
    import torch.distributed as dist

    from planc.runtime.loop import train

    sys.path.insert(0, str(ROOT))
    jobs = {name: _job(payload["layers"], start) for name, start in (("plain", 1000), ("compressing", 2))}
    for job in jobs.values():
        train(job, steps=4, quiet=True)
    calls = {"n": 0}
    original = dist.all_reduce

    def counted(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    dist.all_reduce = counted
    steps: dict[str, list[float]] = {name: [] for name in jobs}
    per_step: dict[str, list[float]] = {name: [] for name in jobs}
    for round_ in range(4):
        for name, job in jobs.items():
            calls["n"] = 0
            records = train(job, steps=4 + 6 * (round_ + 1), quiet=True)
            steps[name] += [r["step_s"] for r in records]
            per_step[name].append(calls["n"] / len(records))
    dist.all_reduce = original
    return {
        **{f"{name}_ms": statistics.median(values) * 1e3 for name, values in steps.items()},
        **{f"{name}_all_reduces": statistics.median(values) for name, values in per_step.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="*", default=[2, 4, 8])
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ROOT))
    from planc_powersgd.compression import gradient_shapes, matrix_elements
    from ranks import run_ranks

    from planc.spec import Plan
    from tests.distributed.cases import CASES

    model = Plan.model_validate(next(c for c in CASES if c["name"] == CASE)["plan"]).model
    print(f"{'layers':>6} {'matrices':>8} {'plain':>9} {'compressing':>11} {'added':>8} {'all-reduces':>11}")
    for layers in args.layers:
        shapes = gradient_shapes(model.model_copy(update={"layers": layers}), tp=1)
        matrices = sum(1 for s in shapes if len(s) == 2 and matrix_elements(s[0], s[1], 1, 2.0)[1] < s[0] * s[1])
        r = run_ranks("bench/powersgd_steps.py:worker", 2, {"layers": layers})
        added = r["compressing_ms"] - r["plain_ms"]
        print(
            f"{layers:>6} {matrices:>8} {r['plain_ms']:>7.2f}ms {r['compressing_ms']:>9.2f}ms {added:>6.2f}ms "
            f"{r['plain_all_reduces']:>5.1f} -> {r['compressing_all_reduces']:.1f}"
        )


if __name__ == "__main__":
    main()
