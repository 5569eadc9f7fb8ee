"""Predicted vs measured step time for every case of the CPU equivalence matrix, before and after calibration.

    python bench/cpu_accuracy.py [--steps N] [--world 2 --world 4] [--case NAME] [--profile-dir DIR]

For each world size of ``tests/distributed/cases.py`` it
(1) runs ``planc calibrate --nproc W`` on this machine (one process per rank, as a user calibrates
a node); skipped when ``--profile-dir`` already holds ``cpu-W.json``; by default a fresh temporary
folder, so every run calibrates;
(2) trains every case of that size for ``--steps`` optimizer steps in one torchrun launch (the
runtime the emitted program runs: compose + train) and takes the median step time after the
first :data:`WARMUP` steps (after the steps a strategy runs before it works as priced, too, run
first as ``planc verify`` runs them: PowerSGD's uncompressed start);
(3) prints planc's predicted step for the case's layout with the ``cpu`` preset's data-sheet
numbers and with the profile, and both errors (measured step / predicted step - 1,
docs/accuracy.md's convention: + means planc predicted the case faster than it ran), then the
median and worst calibrated error per family of strategies (DDP, ZeRO-n, TP, TP+SP, PP and
their combinations).

The machine is shared and timings are noisy: the load average is printed with the table, and
planc's cost per op, as the calibration measured it, is measured again on the same ranks just
before the first case and after the last: when those differ from the calibration's, every case's
error moves with them (a 2-core host read 5-9 us per op within one hour). Compare ratios, and
re-run on a quiet machine before drawing conclusions. ``bench/accuracy.py --cpu`` calls
this.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planc.cost.driver import evaluate  # noqa: E402
from planc.spec import Layout, Plan  # noqa: E402
from planc.spec.hardware import HardwareSpec  # noqa: E402
from planc.spec.hardware_profile import hardware_values, load_profile  # noqa: E402
from planc.strategies.registry import load_registry  # noqa: E402
from tests.distributed.cases import CASES  # noqa: E402
from tests.ranks import run_ranks  # noqa: E402

WARMUP = 2


def time_cases(payload: dict) -> dict:
    """On every rank: train each case and return rank 0's per-step seconds (run by tests/ranks.py);
    under "drift", planc's cost per op (as calibrate measures it, on every rank at once) before the
    first case and after the last."""
    import torch

    from planc.calibrate.dispatch import measure_dispatch
    from planc.runtime.compose import compose
    from planc.runtime.loop import train

    registry = load_registry()
    rates = load_profile(Path(payload["profile"])).measured
    cpu = torch.device("cpu")
    drift = [measure_dispatch(cpu, DRIFT_BUDGET, rates)[-1].seconds]
    out = {}
    for case in payload["cases"]:
        job = compose(Plan.model_validate(case["plan"]), Layout(**case["layout"]), registry)
        records = train(job, steps=case["steps"], quiet=True)
        out[case["name"]] = [r["step_s"] for r in records]
        del job
    # Every rank at once, as the calibration measured (ranks leave the last case at different times).
    torch.distributed.barrier()
    drift.append(measure_dispatch(cpu, DRIFT_BUDGET, rates)[-1].seconds)
    return {"cases": out, "drift": drift}


#: Seconds of repetitions for each drift measurement (calibrate's default budget).
DRIFT_BUDGET = 0.3


def calibrated(plan: Plan, profile_path: Path) -> Plan:
    """``plan`` with ``hardware { profile = ... }`` applied, as build_plan applies it."""
    values = plan.hardware.model_dump(exclude={"world_size"})
    values.update(hardware_values(load_profile(profile_path)))
    values["profile"] = str(profile_path)
    return plan.model_copy(update={"hardware": HardwareSpec.model_validate(values)})


def with_steps(plan: Plan, steps: int) -> dict:
    """The plan as JSON, its learning-rate schedule laid over ``steps`` (step time does not depend on it)."""
    data = plan.model_dump(mode="json")
    data["train"]["steps"] = steps
    return data


def predicted_step(plan: Plan, layout: Layout, registry) -> float:
    return evaluate(plan, layout, registry.passes(plan, layout)).step_s


def ensure_profile(world: int, directory: Path) -> Path:
    path = directory / f"cpu-{world}.json"
    if not path.exists():
        command = [sys.executable, "-m", "planc", "calibrate", "--cpu", "--nproc", str(world), "--out", str(path)]
        subprocess.run(command, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--world", type=int, action="append", help="only cases of this many processes")
    parser.add_argument("--case", action="append", help="only this case (repeatable)")
    parser.add_argument(
        "--profile-dir",
        type=Path,
        help="keep (and reuse) the profiles here; default: calibrate afresh in a temporary folder",
    )
    args = parser.parse_args(argv)
    if args.profile_dir is None:
        args.profile_dir = Path(tempfile.mkdtemp(prefix="planc-cpu-profiles-"))
    args.profile_dir.mkdir(parents=True, exist_ok=True)
    registry = load_registry()
    selected = [
        c for c in CASES if (not args.world or c["world"] in args.world) and (not args.case or c["name"] in args.case)
    ]
    rows = []
    for world in sorted({c["world"] for c in selected}):
        cases = [c for c in selected if c["world"] == world]
        profile = ensure_profile(world, args.profile_dir)
        # Steps a strategy runs before it works as priced (PowerSGD's uncompressed start): run first
        # and left out, as planc verify does.
        unmeasured = {c["name"]: max(registry.steady_after(c["plan"], c["layout"]).values(), default=0) for c in cases}
        payload = [
            {
                "name": c["name"],
                "plan": with_steps(c["plan"], unmeasured[c["name"]] + args.steps),
                "layout": c["layout"].model_dump(),
                "steps": unmeasured[c["name"]] + args.steps,
            }
            for c in cases
        ]
        result = run_ranks(
            "bench/cpu_accuracy.py:time_cases", world, {"cases": payload, "profile": str(profile)}, timeout=1800
        )
        measured = result["cases"]
        print_drift(world, load_profile(profile).measured, result["drift"])
        for c in cases:
            step = statistics.median(measured[c["name"]][unmeasured[c["name"]] + WARMUP :])
            before = predicted_step(c["plan"], c["layout"], registry)
            after = predicted_step(calibrated(c["plan"], profile), c["layout"], registry)
            rows.append((c["name"], world, step, before, after, family(c["layout"])))
    print_table(rows)
    return 0


def print_drift(world: int, measured, drift: list[float]) -> None:
    """How the machine moved while the cases ran: planc's cost per op at 4096 activation elements as
    the calibration measured it, and measured again the same way just before the first case and
    after the last. A prediction is only as good as the calibration's match to the run: when the
    load changes in between, every case moves with it."""
    if not measured.op_costs:
        return
    at_calibration = measured.op_costs[-1].seconds
    before, after = drift
    print(
        f"{world} process(es): cost per op {at_calibration * 1e6:.1f} us at calibration, "
        f"{before * 1e6:.1f} us before the cases ({before / at_calibration - 1:+.0%}), "
        f"{after * 1e6:.1f} us after them ({after / at_calibration - 1:+.0%})"
    )


def print_table(rows) -> None:
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores\n")
    print("| case | procs | measured step | predicted (cpu preset) | error | predicted (calibrated) | error |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, world, step, before, after, _ in rows:
        print(
            f"| {name} | {world} | {step * 1e3:.1f} ms | {before * 1e3:.1f} ms | {step / before - 1:+.0%} "
            f"| {after * 1e3:.1f} ms | {step / after - 1:+.0%} |"
        )
    if rows:
        abs_before = statistics.median(abs(r[2] / r[3] - 1) for r in rows)
        abs_after = statistics.median(abs(r[2] / r[4] - 1) for r in rows)
        within = sum(abs(r[2] / r[4] - 1) <= 0.15 for r in rows)
        print(
            f"\nmedian |error|: {abs_before:.0%} with the cpu preset, {abs_after:.0%} calibrated; "
            f"{within} of {len(rows)} cases within 15% after calibration"
        )
        print_families(rows)


def family(layout: Layout) -> str:
    """The strategies of a layout: "TP+SP", "PP", "ZeRO-3", "TP+DDP" ..."""
    parts = []
    if layout.tp > 1:
        parts.append("TP+SP" if layout.sequence_parallel else "TP")
    if layout.pp > 1:
        parts.append("PP")
    if layout.dp > 1:
        parts.append(("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")[layout.zero])
    return "+".join(parts)


def print_families(rows) -> None:
    """Median and worst |error| after calibration per family of strategies."""
    print("\n| strategies | cases | median \\|error\\| calibrated | worst |")
    print("|---|---:|---:|---:|")
    for name in sorted({r[5] for r in rows}):
        errors = [r[2] / r[4] - 1 for r in rows if r[5] == name]
        worst = max(errors, key=abs)
        print(f"| {name} | {len(errors)} | {statistics.median(abs(e) for e in errors):.0%} | {worst:+.0%} |")


if __name__ == "__main__":
    raise SystemExit(main())
