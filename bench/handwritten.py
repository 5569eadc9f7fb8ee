"""The hand-written baselines of bench/overhead.py: what an engineer writes by hand, no planc runtime.

    torchrun --standalone --nproc-per-node N bench/handwritten.py STRATEGY PLAN.json STEPS OUT.json

STRATEGY is ``ddp``, ``fsdp`` (ZeRO-3: FSDP2 ``fully_shard`` per block, then the root), ``tp``
(DTensor ``parallelize_module``: column/row-parallel attention and MLP, vocabulary-parallel
embedding and head, norms left plain) or ``pp`` (``torch.distributed.pipelining``, one block
range per rank, ``Schedule1F1B``). Every one uses the same model code and initialisation
(planc.runtime.transformer), the same data (planc.runtime.data), fused AdamW with the plan's
hyper-parameters and planc's parameter groups (no decay on biases and norm gains), and
global-norm clipping, so only the training-loop machinery differs from the program planc emits.
No accumulation except PP's micro-batches: the plans of bench/overhead.py give each
data-parallel rank one micro-batch. Rank 0 writes ``wall_s`` and ``cpu_s``, the
``time.perf_counter()`` and ``time.process_time()`` at the end of every step: bench/overhead.py
takes the gaps between them, as it does for planc's program (bench/step_stamps.py), so both are
whole loop iterations by one definition.
"""

import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from planc.runtime.data import build_data
from planc.runtime.transformer import build_model, init_weights
from planc.spec import Plan


def clip_grad_norm(params, max_norm):
    torch.nn.utils.clip_grad_norm_(params, max_norm)


def cross_entropy(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def optimizer_for(plan, params):
    # fused, as planc's program runs it on CPU and CUDA: the same optimizer, so that only the loop's
    # machinery differs (torch's default on CPU is a Python loop over the tensors). The same groups
    # too, as nanoGPT writes them: matrices and embeddings decayed, biases and norm gains not. A
    # fused step cannot mix DTensors and plain tensors (TP leaves the norms plain): a group of each.
    from torch.distributed.tensor import DTensor

    t = plan.train
    params = list(params)
    groups = [
        {"params": [p for p in params if isinstance(p, DTensor) == dtensor and (p.dim() >= 2) == decayed]}
        | {"weight_decay": t.weight_decay if decayed else 0.0}
        for dtensor in (True, False)
        for decayed in (True, False)
    ]
    groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), fused=True)


def ddp(plan, model, rank, world):
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(model, gradient_as_bucket_view=True)
    return model, (rank, world)


def fsdp(plan, model, rank, world):
    from torch.distributed.fsdp import fully_shard

    for block in model.layers.values():
        fully_shard(block)
    fully_shard(model)
    return model, (rank, world)


def tp(plan, model, rank, world):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    parallelize_module(
        model,
        mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate()),
        },
    )
    for block in model.layers.values():
        styles = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
        }
        if block.feed_forward.w3 is not None:
            styles["feed_forward.w3"] = ColwiseParallel()
        parallelize_module(block, mesh, styles)
    return model, (0, 1)  # every TP rank reads the same rows


def clip_mixed(params, max_norm):
    """Global-norm clipping over DTensor shards and plain (replicated) tensors together, which
    ``clip_grad_norm_``'s foreach kernels refuse to mix (TP with plain norms)."""
    from torch.distributed.tensor import DTensor

    params = [p for p in params if p.grad is not None]
    squares = [
        (p.grad.norm() ** 2).full_tensor() if isinstance(p.grad, DTensor) else p.grad.norm() ** 2 for p in params
    ]
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, torch.stack(squares).sum().sqrt(), foreach=False)


def train_loop(plan, model, rows_of, steps, clip):
    rank, shards = rows_of
    optimizer = optimizer_for(plan, model.parameters())
    data = build_data(plan.train, plan.model, base_dir=plan.data_root)
    rows = plan.train.global_batch // shards
    ends = {"wall_s": [], "cpu_s": []}
    for step in range(steps):
        batch = data.rows_for_step(step, rank * rows, (rank + 1) * rows)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        loss = cross_entropy(model(inputs), targets)
        loss.backward()
        clip(list(model.parameters()), plan.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ends["wall_s"].append(time.perf_counter())
        ends["cpu_s"].append(time.process_time())
    return ends


def pp(plan, model, steps, rank, world):
    """One contiguous block range per rank; 1F1B over the plan's micro-batches."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    layers = list(model.layers.keys())
    per = len(layers) // world
    mine = set(layers[rank * per : (rank + 1) * per])
    for name in layers:
        if name not in mine:
            del model.layers[name]
    if rank > 0:
        model.tok_embeddings = None
        model.pos_embeddings = None
    if rank < world - 1:
        model.norm = None
        model.output = None
    stage = PipelineStage(model, rank, world, torch.device("cpu"))
    micro_batches = plan.train.global_batch // plan.train.micro_batch
    schedule = Schedule1F1B(stage, micro_batches, loss_fn=cross_entropy)
    optimizer = optimizer_for(plan, model.parameters())
    data = build_data(plan.train, plan.model, base_dir=plan.data_root)
    ends = {"wall_s": [], "cpu_s": []}
    for step in range(steps):
        batch = data.batch_for_step(step)
        inputs, targets = batch[:, :-1], batch[:, 1:]
        if rank == 0:
            schedule.step(inputs)
        elif rank == world - 1:
            schedule.step(target=targets)
        else:
            schedule.step()
        # Global-norm clipping over the pipeline: sum the squared norms of every stage.
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        squared = torch.stack([g.pow(2).sum() for g in grads]).sum() if grads else torch.zeros(())
        dist.all_reduce(squared)
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), plan.train.grad_clip, squared.sqrt())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ends["wall_s"].append(time.perf_counter())
        ends["cpu_s"].append(time.process_time())
    return ends


def main(strategy: str, plan_path: str, steps: int, out_path: str) -> None:
    plan = Plan.from_json(open(plan_path).read())
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(plan.model)
    init_weights(model, plan.train.seed)
    if strategy == "pp":
        ends = pp(plan, model, steps, rank, world)
    else:
        model, rows_of = {"ddp": ddp, "fsdp": fsdp, "tp": tp}[strategy](plan, model, rank, world)
        ends = train_loop(plan, model, rows_of, steps, clip_mixed if strategy == "tp" else clip_grad_norm)
    if rank == 0:
        json.dump(ends, open(out_path, "w"))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
