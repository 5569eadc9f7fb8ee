"""planc's layouts on one node of GPUs, each run by `planc verify`: the checks one GPU could not make.

    python bench/gpu_layouts.py --gpus N [--out DIR] [--only NAME ...] [--steps 6]

For a node of N CUDA devices (N >= 2; bench/gpu_check.sh runs it when it finds them) it writes one
plan per layout below into DIR, runs ``planc verify`` on each (the emitted program, NCCL, the
plan's own GPUs) and prints, per layout, predicted beside measured: step time, the allocated peak,
each mesh dimension's communication bytes, and from one profiled step the time in computing
kernels, in collectives no computing kernel hides, and with the device idle (verify's
``kernel_timeline``) against the model's parts. The
results go to DIR/layouts.json. Two questions the first GPU run (one H100) could not answer:

- **The strategies on GPUs at all.** DDP, ZeRO-1, FSDP (ZeRO-3), TP + SP and a 1F1B pipeline of
  the 4-layer Llama 3 8B plan of docs/gpu.md (``8b-*``): every multi-GPU path planc has, which
  until then had run only on CPU processes over gloo.
- **TP 4 or TP 8** (issue 12, the judgment scenarios marked ``TP_EXPOSED``): planc's model says
  eager DTensor TP exposes its collectives, so a 70B-class block runs faster as TP 4 x ZeRO-3 than
  as TP 8, which Megatron-LM and torchtitan chose. ``70b-tp*`` run Llama 3 70B's block (4 of its
  layers) as TP 8, TP 4 x ZeRO-3 over 2 and TP 2 x ZeRO-3 over 4 on 8 GPUs, with sequence
  parallelism: measured step times decide it.

Without N devices the plans still run: ``planc verify`` then runs its CPU stand-in (smaller model,
CPU processes) and says so, which checks this script, not the GPUs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODEL_8B = 'preset = "llama3-8b"\n  layers  = 4\n  seq_len = 8192'
MODEL_70B = 'preset = "llama3-70b"\n  layers  = 4\n  seq_len = 4096'


def layouts(gpus: int) -> list[tuple[str, str, str, str]]:
    """(name, model block body, train keys, layout block body) for a node of ``gpus`` devices."""
    pp = 4 if gpus >= 4 else 2
    tp = min(gpus, 8)
    batch = f"global_batch = {4 * gpus}\n  micro_batch  = 1"
    found = [
        ("8b-ddp", MODEL_8B, batch, f"tp = 1  pp = 1  dp = {gpus}  zero = 0"),
        ("8b-zero1", MODEL_8B, batch, f"tp = 1  pp = 1  dp = {gpus}  zero = 1"),
        ("8b-fsdp", MODEL_8B, batch, f"tp = 1  pp = 1  dp = {gpus}  zero = 3"),
        (
            "8b-tp-sp",
            MODEL_8B,
            batch,
            f"tp = {tp}  pp = 1  dp = {gpus // tp}  {zero_1(gpus // tp)}sequence_parallel = true",
        ),
        ("8b-pp-1f1b", MODEL_8B, batch, f"tp = 1  pp = {pp}  dp = {gpus // pp}  {zero_1(gpus // pp)}schedule = 1f1b"),
    ]
    if gpus >= 8:
        tp_batch = "global_batch = 16\n  micro_batch  = 1"
        for t in (8, 4, 2):
            sharding = "" if t == 8 else "zero = 3  "  # TP 8 fills the node: no data parallelism to shard over
            found.append(
                (
                    f"70b-tp{t}",
                    MODEL_70B,
                    tp_batch,
                    f"tp = {t}  pp = 1  dp = {8 // t}  {sharding}sequence_parallel = true  recompute = none",
                )
            )
    return found


def zero_1(dp: int) -> str:
    """ZeRO-1 where there is data parallelism to shard the optimizer over."""
    return "zero = 1  " if dp > 1 else ""


def plan_text(name: str, model: str, train: str, layout: str, gpus: int) -> str:
    return (
        f"# bench/gpu_layouts.py: {name} on one node of {gpus} H100s\n\n"
        f"model {{\n  {model}\n}}\n\n"
        f'hardware {{\n  device   = "H100-SXM"\n  nodes    = 1\n  per_node = {gpus}\n}}\n\n'
        f"train {{\n  {train}\n  precision    = bf16\n  lr           = 3e-4\n  steps        = 30\n"
        f"  data         = synthetic\n}}\n\n"
        f"layout {{\n  {layout}\n}}\n"
    )


def summary(name: str, result: dict, explained: dict) -> dict:
    rows = {(r["section"], r["name"]): r for r in result["rows"] if r["rank"] == 0}
    exposed = {c["group"]: c.get("exposed_s") for c in explained.get("comm") or []}

    def pair(section: str, row: str) -> tuple[float | None, float | None]:
        found = rows.get((section, row))
        return (found["predicted"], found["measured"]) if found else (None, None)

    comm = {r["name"]: (r["predicted"], r["measured"]) for r in result["rows"] if r["section"] == "communication"}
    return {
        "layout": name,
        "describe": result["describe"],
        "stand_in": result.get("stand_in", []),
        "step_s": pair("step time", "median step"),
        # on CUDA the allocated peak (net of context and margin); a CPU stand-in's is the tracker's
        "peak_bytes": pair("peak memory", "allocated")
        if ("peak memory", "allocated") in rows
        else pair("peak memory", "step peak"),
        "comm_bytes": comm,
        # on CUDA, the profiled step (planc.verify.kernel_timeline) against the model's parts
        "compute_kernels_s": pair("step time", "compute kernels"),
        "communication_exposed_s": pair("step time", "communication exposed"),
        "device_idle_s": pair("step time", "device idle"),
        "exposed_s_predicted": exposed,
    }


def run(name: str, path: Path, out: Path, steps: int) -> dict | None:
    """``planc verify --json`` of one plan, and ``planc explain --json`` of it for the exposed times."""
    verify = subprocess.run(
        [sys.executable, "-m", "planc", "verify", str(path), "--steps", str(steps), "--json", "--out", str(out / name)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    (out / f"{name}.log").write_text(verify.stdout + verify.stderr)
    if verify.returncode != 0:
        print(f"{name}: planc verify failed (exit {verify.returncode}); {out / name}.log has its output")
        return None
    explain = subprocess.run(
        [sys.executable, "-m", "planc", "explain", str(path), "--json"], cwd=ROOT, capture_output=True, text=True
    )
    explained = json.loads(explain.stdout) if explain.returncode == 0 else {}
    return summary(name, json.loads(verify.stdout), explained)


def fmt(pair: tuple[float | None, float | None], scale: float, unit: str) -> str:
    predicted, measured = pair
    if predicted is None or not measured:
        return "-"
    return f"{predicted / scale:.2f} / {measured / scale:.2f} {unit} ({predicted / measured - 1:+.1%})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, required=True, help="devices on this node (2 or more)")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-layouts"))
    parser.add_argument("--only", action="append", help="run only this layout (repeatable)")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    if args.gpus < 2:
        print("gpu_layouts: needs 2 or more devices (one GPU: bench/gpu_check.sh's other steps)")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name, model, train, layout in layouts(args.gpus):
        if args.only and name not in args.only:
            continue
        path = args.out / f"{name}.plan"
        path.write_text(plan_text(name, model, train, layout, args.gpus))
        result = run(name, path.resolve(), args.out.resolve(), args.steps)
        if result is None:
            continue
        results.append(result)
        note = " (CPU stand-in)" if result["stand_in"] else ""
        print(f"RESULT {name:11} {result['describe']}{note}")
        step, peak = fmt(result["step_s"], 1e-3, "ms"), fmt(result["peak_bytes"], 2**30, "GiB")
        print(f"RESULT   step {step}   peak {peak}")
        if result["compute_kernels_s"][1]:
            parts = (
                f"compute kernels {fmt(result['compute_kernels_s'], 1e-3, 'ms')}   "
                f"exposed communication {fmt(result['communication_exposed_s'], 1e-3, 'ms')}   "
                f"idle {fmt(result['device_idle_s'], 1e-3, 'ms')}"
            )
            print(f"RESULT   {parts}")
        for group, (predicted, measured) in result["comm_bytes"].items():
            exposed = None if result["stand_in"] else result["exposed_s_predicted"].get(group)
            print(
                f"RESULT   {group:6} bytes {fmt((predicted, measured), 2**20, 'MiB')}"
                + (f"   exposed (model) {exposed * 1e3:.1f} ms" if exposed else "")
            )
    (args.out / "layouts.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0 if results else 1


if __name__ == "__main__":
    raise SystemExit(main())
