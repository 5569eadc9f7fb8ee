"""The program ``planc calibrate`` runs on every rank (under torchrun, or alone for one process).

    python -m planc.calibrate.worker --workload W.json --out PROFILE.json [--budget S]

Every rank measures compute at the same time (on a node its neighbours are busy too, as in
training; on CPU the processes share the cores, as the CPU programs do) and rank 0's numbers are
written; then the collectives run over the real process group: NCCL on GPUs, gloo on CPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
from pathlib import Path

import torch
import torch.distributed as dist

from planc import __version__
from planc.calibrate.attention import measure_attention
from planc.calibrate.collectives import measure_group, node_groups
from planc.calibrate.dispatch import measure_dispatch
from planc.calibrate.gemm import measure_gemms
from planc.calibrate.memory_bw import measure_memory_bandwidth
from planc.calibrate.recompute_block import measure_recompute
from planc.calibrate.split_backward import measure_split_backward
from planc.calibrate.step_tensors import measure_step_tensors
from planc.calibrate.wrappers import measure_wrappers
from planc.runtime.job import init_process_group
from planc.spec.hardware_profile import SCHEMA_VERSION, HardwareProfile, MeasuredRates, fit_notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="planc.calibrate.worker")
    parser.add_argument("--workload", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--budget", type=float, default=0.3, help="seconds of repetitions per measurement")
    parser.add_argument("--cpu", action="store_true", help="measure the CPU even when a GPU is present")
    args = parser.parse_args(argv)
    workload = json.loads(args.workload.read_text())
    device = pick_device(args.cpu)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    if world > 1:
        # The training program's own set-up (NCCL bound to this rank's GPU beside gloo for object
        # collectives; gloo on CPU), so the collectives are measured over the groups training uses.
        init_process_group(device)
    try:
        measured = measure_compute(workload, device, args.budget)
        collectives = []
        if world > 1:
            intra, inter = node_groups(world, per_node)
            repeats = max(3, int(args.budget * 20))
            if intra is not None:
                collectives += measure_group(intra, "intra_node", workload["message_bytes"], device, repeats)
            if inter is not None:
                collectives += measure_group(inter, "inter_node", workload["message_bytes"], device, repeats)
            collectives = gather_fits(collectives)
            measured = measured.model_copy(update={"wrappers": measure_wrappers(device, args.budget)})
        # One process suffices for checkpointing's and the split backward's own work, and the step's
        # per tensor (no collectives): every calibration has them.
        full, selective = measure_recompute(device, args.budget)
        clip, optimizer = measure_step_tensors(device, args.budget)
        full_autocast, selective_autocast = measure_recompute(device, args.budget, autocast=True)
        recompute = {
            "checkpoint_per_block": full,
            "selective_per_block": selective,
            "checkpoint_per_block_autocast": full_autocast,
            "selective_per_block_autocast": selective_autocast,
            "split_backward_per_block": measure_split_backward(device, args.budget),
            "clip_per_tensor": clip,
            "optimizer_per_tensor": optimizer,
        }
        measured = measured.model_copy(update={"wrappers": measured.wrappers.model_copy(update=recompute)})
        if int(os.environ.get("RANK", "0")) == 0:
            profile = describe(device, world, per_node, measured, collectives)
            args.out.write_text(profile.model_dump_json(indent=2) + "\n")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def pick_device(force_cpu: bool) -> torch.device:
    if torch.cuda.is_available() and not force_cpu:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def measure_compute(workload: dict, device: torch.device, budget: float) -> MeasuredRates:
    gemm, attention = [], []
    for dtype in workload["dtypes"]:
        gemm += measure_gemms([tuple(s) for s in workload["gemms"]], dtype, device, budget)
        attention += measure_attention([tuple(s) for s in workload["attention"]], dtype, device, budget)
    rates = MeasuredRates(
        gemm=tuple(gemm), attention=tuple(attention), memory_bandwidth=measure_memory_bandwidth(device, budget)
    )
    # Per op beyond the kernels the cost model prices with the rates just measured.
    op_costs = measure_dispatch(device, budget, rates)
    larger = op_costs[-1]
    return rates.model_copy(
        update={
            "op_costs": op_costs,
            "seconds_per_op": op_costs[0].seconds,
            # What the bf16 modes cost over fp32 (for display, and the fallback of a profile
            # without per-mode figures): at the larger size, where the op's own work shows most.
            "bf16_host_factor": larger.seconds_bf16 / larger.seconds if larger.seconds else 1.0,
            "autocast_host_factor": larger.seconds_autocast / larger.seconds if larger.seconds else 1.0,
        }
    )


def gather_fits(fits: list) -> list:
    """Every rank's fits on rank 0 (the inter-node groups are measured by several ranks: keep one per kind)."""
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, fits)
    seen, unique = set(), []
    for rank_fits in everyone:
        for fit in rank_fits:
            key = (fit.kind, fit.medium)
            if key not in seen:
                seen.add(key)
                unique.append(fit)
    return unique


def describe(device: torch.device, world: int, per_node: int, measured, collectives) -> HardwareProfile:
    cuda = device.type == "cuda"
    return HardwareProfile(
        schema_version=SCHEMA_VERSION,
        planc_version=__version__,
        torch_version=torch.__version__,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        host=socket.gethostname(),
        backend="nccl" if cuda else "gloo",
        device_kind="cuda" if cuda else "cpu",
        device_name=torch.cuda.get_device_name(device) if cuda else cpu_name(),
        world_size=world,
        nodes=max(1, world // per_node),
        per_node=per_node,
        threads=torch.get_num_threads(),
        measured=measured,
        collectives=tuple(collectives),
        notes=tuple(fit_notes(collectives)),
    )


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    raise SystemExit(main())
