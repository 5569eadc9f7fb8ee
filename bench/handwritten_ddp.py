"""The hand-written baseline of bench/runtime_overhead.py: plain PyTorch DDP, no planc runtime.

What an engineer would write by hand for the same job: the same model class and data (so only
the training-loop machinery differs), DistributedDataParallel with gradient_as_bucket_view,
fused AdamW (as planc runs it), gradient accumulation under no_sync, global-norm clipping. Run under torchrun:

    torchrun --standalone --nproc-per-node 4 bench/handwritten_ddp.py PLAN.json STEPS OUT.json
"""

import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from planc.runtime.data import build_data
from planc.runtime.transformer import build_model, init_weights
from planc.spec import Plan


def main(plan_path: str, steps: int, out_path: str) -> None:
    plan = Plan.from_json(open(plan_path).read())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(plan.model)
    init_weights(model, plan.train.seed)
    model = DistributedDataParallel(model, gradient_as_bucket_view=True)
    # fused, as planc's program (torch's default on CPU is a Python loop over the tensors); decay on
    # matrices and embeddings, not on biases and norm gains, as planc's groups (and nanoGPT's)
    params = list(model.parameters())
    decay = plan.train.weight_decay
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=plan.train.lr, betas=(plan.train.beta1, plan.train.beta2), fused=True)
    data = build_data(plan.train, plan.model, base_dir=plan.data_root)
    rows = plan.train.global_batch // world
    mb = plan.train.micro_batch
    times = []
    for step in range(steps):
        began = time.perf_counter()
        batch = data.rows_for_step(step, rank * rows, (rank + 1) * rows)
        chunks = batch.split(mb)
        for i, chunk in enumerate(chunks):
            inputs, targets = chunk[:, :-1], chunk[:, 1:]
            context = model.no_sync() if i < len(chunks) - 1 else torch.enable_grad()
            with context:
                logits = model(inputs)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1)) / len(chunks)
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), plan.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - began)
    if rank == 0:
        json.dump({"step_s": times}, open(out_path, "w"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
