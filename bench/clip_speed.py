"""Gradient clipping over sharded gradients: planc's against torch's ``clip_grad_norm_``, side by side.

    python bench/clip_speed.py [--rounds 60]

For each of bench/overhead.py's layouts of the tiny CPU model (DDP, FSDP, TP; 2 gloo ranks, one
launch each through tests/ranks.py) it composes planc's job, gives every parameter a random
gradient, and times, alternating, with a barrier before each:

* ``planc``: :func:`planc.runtime.step.clip_grad_norm`, which works on the local shards
  (:mod:`planc.runtime.grad_norm`);
* ``torch``: ``torch.nn.utils.clip_grad_norm_`` on the same parameters (DTensor gradients go
  through DTensor's dispatch, op by op);
* ``dtensor``: what planc did before 2026-11-29: ``get_total_norm`` per kind of gradient,
  ``full_tensor()``, then ``clip_grads_with_norm_`` with a plain-tensor coefficient.

It prints each one's median wall and CPU time, and the norms (which agree to float32 rounding;
torch's differs under TP, where it cannot tell the replicated norm gains from shards). The
maximum norm is large, so every run rescales by 1 and the gradients stay the same.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _dtensor_clip(params: list, max_norm: float):
    """The clipping through DTensor: a norm per kind of gradient, reduced by ``full_tensor()``."""
    import torch

    kinds: dict = {}
    for p in params:
        grad = p.grad
        kinds.setdefault(
            (grad.device_mesh, tuple(grad.placements)) if hasattr(grad, "placements") else None, []
        ).append(p)
    norms = []
    for group in kinds.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group], 2.0)
        norms.append((norm.full_tensor() if hasattr(norm, "full_tensor") else norm).float())
    total = torch.linalg.vector_norm(torch.stack(norms))
    for group in kinds.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total


def worker(payload: dict) -> dict:
    """On each rank: the strategy's job, then the three clippings in turn; rank 0's medians return."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT))
    from bench.overhead import plan_text
    from planc.dsl.load import load_plan_text
    from planc.planner.choose import fixed_layout
    from planc.runtime.compose import compose
    from planc.runtime.step import clip_grad_norm
    from planc.strategies.registry import load_registry

    registry = load_registry()
    plan = load_plan_text(plan_text(payload["strategy"], dist.get_world_size(), 100), strategies=registry)
    layout = fixed_layout(plan)
    assert layout is not None
    job = compose(plan, layout, registry)
    params = list(job.local_parameters)
    torch.manual_seed(dist.get_rank())
    for p in params:
        p.grad = torch.randn_like(p)
    max_norm = 1e9

    def as_number(norm) -> float:
        return float((norm.full_tensor() if hasattr(norm, "full_tensor") else norm).item())

    clippings = {
        "planc": lambda: clip_grad_norm(job, max_norm),
        "torch": lambda: torch.nn.utils.clip_grad_norm_(params, max_norm),
        "dtensor": lambda: _dtensor_clip(params, max_norm),
    }
    result: dict = {"norm": {name: as_number(clip()) for name, clip in clippings.items()}}
    wall: dict[str, list[float]] = {name: [] for name in clippings}
    cpu: dict[str, list[float]] = {name: [] for name in clippings}
    for _ in range(payload["rounds"]):
        for name, clip in clippings.items():
            dist.barrier()
            began, began_cpu = time.perf_counter(), time.process_time()
            clip()
            wall[name].append(time.perf_counter() - began)
            cpu[name].append(time.process_time() - began_cpu)
    result["wall_ms"] = {name: statistics.median(v) * 1e3 for name, v in wall.items()}
    result["cpu_ms"] = {name: statistics.median(v) * 1e3 for name, v in cpu.items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--strategy", choices=("ddp", "fsdp", "tp"), action="append")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from ranks import run_ranks

    print("| layout | planc | torch clip_grad_norm_ | via DTensor (before) | planc / torch | norms (planc, torch) |")
    print("|---|---:|---:|---:|---:|---|")
    for strategy in args.strategy or ["ddp", "fsdp", "tp"]:
        r = run_ranks("bench/clip_speed.py:worker", 2, {"strategy": strategy, "rounds": args.rounds})
        wall, cpu, norm = r["wall_ms"], r["cpu_ms"], r["norm"]
        cells = [f"{wall[n]:.2f} ms ({cpu[n]:.2f} CPU)" for n in ("planc", "torch", "dtensor")]
        print(
            f"| {strategy} | {' | '.join(cells)} | {wall['planc'] / wall['torch']:.2f} | "
            f"{norm['planc']:.6g}, {norm['torch']:.6g} |"
        )


if __name__ == "__main__":
    main()
