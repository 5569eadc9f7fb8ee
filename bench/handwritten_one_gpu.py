"""The hand-written baseline for a plan on one CUDA device: what an engineer writes without planc.

    python bench/handwritten_one_gpu.py RUN_DIR/plan.json STEPS OUT.json [--profile-step N]

PLAN.json is the plan a planc run directory holds, or `planc check --json` prints.

The plan's model (planc.runtime.transformer, the same code and initialisation as planc's program),
its synthetic data (planc.runtime.data), AdamW with its hyper-parameters, bf16 autocast over fp32
weights (what planc runs without data parallelism) or plain fp32, gradient accumulation over the
plan's micro-batches, global-norm clipping, and a plain ``F.cross_entropy`` over the whole logits.
No distributed wrapper: one device. Writes, per step, the loss and the ``time.perf_counter()`` at
the step's end after a device synchronisation (``wall_s``), and ``torch.cuda.max_memory_allocated``
(``peak_bytes``); bench/gpu_check.sh sets the median step gap beside the ``step_s`` planc's own
program logs for the same plan.

With ``--profile-step N`` step N runs under ``torch.profiler`` and OUT.json also gets
``kernels``: the device time of that step's kernels by kind (GEMM, attention, loss, optimizer,
other: elementwise ops, norms, casts, reductions), read from the profiler's Chrome trace, beside
the step's wall time -- what the cost model's compute terms claim to add up to.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from planc.runtime.data import build_data
from planc.runtime.optim import build_optimizer, lr_at
from planc.runtime.transformer import build_model, init_weights
from planc.spec import Plan
from planc.verify.kernel_timeline import kernel_events, kernel_kind


def kernels_by_kind(trace_path: str, top: int = 40) -> tuple[dict[str, float], list]:
    """Seconds of device time per kernel kind (:func:`planc.verify.kernel_timeline.kernel_kind`) in a
    Chrome trace written by ``torch.profiler``, and the ``top`` kernels by time: [kind, name (cut at
    120 characters), seconds, launches]."""
    seconds: dict[str, float] = {}
    by_name: dict[str, list] = {}
    for name, start, end in kernel_events(Path(trace_path)):
        kind = kernel_kind(name)
        seconds[kind] = seconds.get(kind, 0.0) + (end - start)
        entry = by_name.setdefault(name[:120], [kind, name[:120], 0.0, 0])
        entry[2] += end - start
        entry[3] += 1
    return seconds, sorted(by_name.values(), key=lambda e: -e[2])[:top]


def main(plan_path: str, steps: int, out_path: str, profile_step: int | None = None, fused: bool = False) -> None:
    raw = json.loads(Path(plan_path).read_text())
    plan = Plan.model_validate(raw.get("plan", raw))  # a run directory's plan.json, or `planc check --json`'s
    cuda = torch.cuda.is_available()  # the CPU is for trying the script out; the baseline is a GPU's
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    model = build_model(plan.model, device=device)
    init_weights(model, plan.train.seed)
    optimizer = build_optimizer(model.parameters(), plan.train)
    if fused:  # the same groups and hyper-parameters, one fused kernel per step instead of foreach passes
        # Each group carries its own "fused"/"foreach" (None): rebuild the groups from params and decay only.
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in optimizer.param_groups]
        keys = ("lr", "betas", "eps")
        optimizer = type(optimizer)(groups, **{k: optimizer.defaults[k] for k in keys}, fused=True)
    data = build_data(plan.train, plan.model, base_dir=plan.data_root)
    micro = plan.train.micro_batch
    accumulation = plan.train.global_batch // micro
    bf16 = plan.train.precision == "bf16"
    record: dict[str, list] = {"wall_s": [], "loss": []}
    for step in range(steps):
        profiler = None
        if step == profile_step:
            from torch.profiler import ProfilerActivity, profile

            profiler = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
            if cuda:
                torch.cuda.synchronize(device)
            began = time.perf_counter()
            profiler.__enter__()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, plan.train)
        batch = data.batch_for_step(step).to(device)
        total = torch.zeros((), device=device)
        for i in range(accumulation):
            rows = batch[i * micro : (i + 1) * micro]
            autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
            with autocast:
                logits = model(rows[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), rows[:, 1:].flatten()) / accumulation
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), plan.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        record["loss"].append(float(total))  # synchronises, as a logged loss does
        record["wall_s"].append(time.perf_counter())
        if profiler is not None:
            profiler.__exit__(None, None, None)
            with tempfile.TemporaryDirectory() as tmp:
                trace = str(Path(tmp) / "trace.json")
                profiler.export_chrome_trace(trace)
                kinds, top = kernels_by_kind(trace)
                record["kernels"] = {"step_s": record["wall_s"][-1] - began, **kinds}
                record["top_kernels"] = top
    record["peak_bytes"] = [torch.cuda.max_memory_allocated(device) if cuda else 0]
    Path(out_path).write_text(json.dumps(record) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plan_json")
    parser.add_argument("steps", type=int)
    parser.add_argument("out")
    parser.add_argument(
        "--profile-step", type=int, help="profile this step: device time by kernel kind (no kernels on CPU)"
    )
    parser.add_argument("--fused", action="store_true", help="AdamW/Adam with fused=True")
    args = parser.parse_args()
    main(args.plan_json, args.steps, args.out, args.profile_step, args.fused)
