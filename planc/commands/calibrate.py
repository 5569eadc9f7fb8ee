"""``planc calibrate``: measure this machine and write a hardware profile a plan can name.

    planc calibrate [--out FILE] [--plan FILE] [--nproc N] [--quick] [--cpu]

Starts ``--nproc`` processes under torchrun (one per device; default: the GPUs here, or 2 CPU
processes) running :mod:`planc.calibrate.worker`, so the collectives run over a real process group.
Already under torchrun (``planc calibrate`` as the program of a multi-node torchrun), it measures
in place, across nodes too. docs/calibrate.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from planc.errors import PlanError

HELP = "measure this machine (GEMM, attention, memory, collectives) into a hardware profile"
DESCRIPTION = (
    "Run micro-benchmarks on this machine — GEMM throughput at the shapes a plan uses, causal "
    "attention, streaming memory bandwidth, eager dispatch overhead, and all-reduce / all-gather / "
    "reduce-scatter / send-recv bandwidth and latency over a real process group, and (with 2 or more "
    "processes) the host time DDP, FSDP2, DTensor TP and the pipeline schedule add per unit — and write them as "
    'a JSON hardware profile. A plan uses it with hardware { profile = "FILE" }.'
)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--out", default="hardware-profile.json", help="profile to write (default hardware-profile.json)"
    )
    parser.add_argument("--plan", metavar="FILE", help="measure the shapes and message sizes this plan needs")
    parser.add_argument("--nproc", type=int, default=None, help="processes to start (default: GPUs here, or 2 on CPU)")
    parser.add_argument("--quick", action="store_true", help="fewer shapes and sizes, shorter timing (under a minute)")
    parser.add_argument("--cpu", action="store_true", help="measure CPU processes (gloo) even when GPUs are present")


def run(args) -> int:
    from planc.calibrate.shapes import default_workload, plan_workload

    out = Path(args.out)
    if out.exists() and out.is_dir():
        raise PlanError(f"--out {args.out} is a directory", hint="give a file name, e.g. --out cluster.json")
    if args.nproc is not None and args.nproc < 1:  # checked as given: `args.nproc or default` read 0 as unset
        raise PlanError(f"--nproc must be at least 1, got {args.nproc}", hint="e.g. --nproc 4")
    cpu = args.cpu or not _has_gpu()
    if args.plan:
        from planc.commands.explain import read_plan
        from planc.strategies.registry import load_registry

        plan = read_plan(args.plan, load_registry())
        _refuse_another_device(plan, args.plan, cpu, args.cpu)
        workload = plan_workload(plan, args.quick)
    else:
        workload = default_workload(args.quick, cpu)
    budget = "0.1" if args.quick else "0.3"
    with tempfile.TemporaryDirectory(prefix="planc-calibrate-") as tmp:
        spec = Path(tmp) / "workload.json"
        spec.write_text(json.dumps(asdict(workload)))
        worker = ["-m", "planc.calibrate.worker", "--workload", str(spec), "--out", str(out), "--budget", budget]
        worker += ["--cpu"] if cpu else []
        if "LOCAL_WORLD_SIZE" in os.environ:  # already one of torchrun's processes
            from planc.calibrate.worker import main

            return main(worker[2:])
        nproc = args.nproc if args.nproc is not None else (_gpu_count() if not cpu else 2)
        command = [sys.executable, *worker]
        if nproc > 1:
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={nproc}",
                *worker,
            ]
        print(f"planc calibrate: measuring with {nproc} process(es) on {'CPU (gloo)' if cpu else 'GPU (NCCL)'} ...")
        status = subprocess.run(command).returncode
    if status != 0 or not out.exists():
        raise PlanError(
            f"calibration failed (exit status {status})", hint="see the messages above; try --quick or --nproc 1"
        )
    _summarise(out)
    print(use_it_line(out, args.plan))
    return 0


def use_it_line(out: Path, plan_file: str | None) -> str:
    """How a plan names the profile just written: a path relative to ``plan_file``'s folder (how
    ``hardware.profile`` resolves) when ``--plan`` named one, else the absolute path (the plan's
    folder is unknown; the bare file name worked only for a plan beside it). JSON-quoted, as the
    .plan language writes a string."""
    if plan_file:
        where = os.path.relpath(out.resolve(), Path(plan_file).resolve().parent)
        return f"use it: hardware {{ profile = {json.dumps(where)} }} in {plan_file}"
    return f"use it: hardware {{ profile = {json.dumps(str(out.resolve()))} }} (or a path relative to the .plan file)"


def _refuse_another_device(plan, plan_file: str, cpu: bool, cpu_asked: bool) -> None:
    """The plan refuses a profile measured on another kind of device (``hardware.profile``): a GPU
    plan's shapes measured on CPU processes, or a CPU plan's on GPUs, is said before the measurement,
    not found when the plan names the profile."""
    if plan.hardware.is_cpu == cpu:
        return
    if cpu:
        why = "--cpu" if cpu_asked else "this machine has no GPU"
        raise PlanError(
            f"--plan {plan_file} runs on {plan.hardware.device}, but this calibration measures CPU processes "
            f"({why}): the plan would refuse the profile (it must be measured on the plan's device)",
            hint="run `planc calibrate --plan` on the plan's hardware; a CPU profile needs a CPU plan or no --plan",
        )
    raise PlanError(
        f"--plan {plan_file} runs on CPU processes, but this calibration measures the GPUs here: the plan "
        "would refuse the profile (it must be measured on the plan's device)",
        hint="add --cpu",
    )


def _has_gpu() -> bool:
    return _gpu_count() > 0


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def _summarise(out: Path) -> None:
    from planc.spec.hardware_profile import load_profile
    from planc.units import format_bandwidth, format_seconds, format_tflops

    def rate(flops: float) -> str:
        return f"{format_tflops(flops / 1e12)} TFLOP/s"

    profile = load_profile(out)
    m = profile.measured
    best = max((g.flops for g in m.gemm), default=0.0)
    print(f"wrote {out}: {profile.device_name}, {profile.world_size} process(es), torch {profile.torch_version}")
    print(f"  GEMM: best {rate(best)} over {len(m.gemm)} shapes")
    for a in m.attention:
        print(f"  attention s={a.seq_len} d={a.head_dim}: {rate(a.forward_flops)} fwd, {rate(a.backward_flops)} bwd")
    if m.memory_bandwidth:
        print(f"  memory: {format_bandwidth(m.memory_bandwidth)} (triad)")
    for p in m.op_costs:
        print(
            f"  eager ops at {p.elements:.0f} activation elements (beyond their kernels): "
            f"{format_seconds(p.seconds)} per op in fp32, {format_seconds(p.seconds_bf16)} with bf16 parameters, "
            f"{format_seconds(p.seconds_autocast)} under autocast (per fp32 op)"
        )
    if not m.op_costs:
        print(f"  eager dispatch: {format_seconds(m.seconds_per_op)} per aten op")
    w = m.wrappers
    print(
        f"  wrappers: DDP {format_seconds(w.ddp_per_tensor)} per parameter tensor per step, replicate "
        f"{format_seconds(w.replicate_per_unit)} per unit, FSDP "
        f"{format_seconds(w.fsdp_per_unit)} per unit, TP {format_seconds(w.tp_per_block)} per block "
        f"({format_seconds(w.tp_sp_per_block)} with SP) "
        f"(per micro-batch), pipeline {format_seconds(w.pp_per_action)} per schedule action, "
        "clipping and optimizer over DTensor parameters "
        f"+{format_seconds(w.dtensor_optimizer_per_tensor)} per tensor per step"
    )
    print(
        f"  activation checkpointing, beyond the rerun forward: full {format_seconds(w.checkpoint_per_block)}, "
        f"selective {format_seconds(w.selective_per_block)} per block per micro-batch "
        f"(under bf16 autocast: {format_seconds(w.checkpoint_per_block_autocast)}, "
        f"{format_seconds(w.selective_per_block_autocast)})"
    )
    print(
        f"  zero-bubble's split backward, beyond one backward: {format_seconds(w.split_backward_per_block)} "
        "per block per micro-batch"
    )
    print(
        f"  the step per parameter tensor, beyond its ops: clipping {format_seconds(w.clip_per_tensor)}, "
        f"optimizer {format_seconds(w.optimizer_per_tensor)}"
    )
    for c in profile.collectives:
        speed = f"{format_bandwidth(c.bandwidth)}, latency {format_seconds(c.latency)}"
        if c.problem:
            speed = "not fitted, priced with the data sheet (see the note below)"
        print(f"  {c.kind} x{c.group_size} ({c.medium}): {speed}")
    for note in profile.notes:
        print(f"  note: {note}")
