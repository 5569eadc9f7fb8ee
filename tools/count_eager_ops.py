"""Count the eager aten ops of planc's program, for the host-overhead term of the cost model.

    python tools/count_eager_ops.py               # prints the tables of planc/cost/dispatch.py
    python tools/count_eager_ops.py --step-only   # only the per-step ones
    python tools/count_eager_ops.py --dtensor     # the DTensor ops under tensor parallelism

Counts are taken with a ``TorchDispatchMode`` (every aten op that reaches the dispatcher, views
included) on one process:

- per block, forward and backward, for each (norm, mlp, position) of planc.runtime.transformer
  (the difference between 2 and 1 layers, micro-batch of 4 x 16 tokens);
- per training step of the real loop (planc.runtime.loop.train over a composed job): the
  difference between 2 and 1 layers gives the optimizer's ops per block, between 2 and 1
  micro-batches the ops per micro-batch outside the blocks; the rest is fixed per step;
- with ``--dtensor``: the ops that reach DTensor's dispatch under tensor parallelism (TP 2 over
  torch's ``fake`` process group, one process; the same with and without sequence parallelism)
  per block, forward and backward, and per micro-batch outside the blocks (embedding, final norm,
  head, loss parallelism) -- what DTensor's per-op cost multiplies (planc.cost.wrappers.tp_seconds).
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from planc.runtime.compose import compose  # noqa: E402
from planc.runtime.loop import train  # noqa: E402
from planc.runtime.transformer import Transformer  # noqa: E402
from planc.spec import Layout, build_plan  # noqa: E402
from planc.strategies.registry import load_registry  # noqa: E402


class CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def plan_for(
    layers: int,
    norm: str,
    mlp: str,
    position: str,
    global_batch: int = 8,
    steps: int = 50,
    per_node: int = 1,
    precision: str = "bf16",
):
    model = dict(
        layers=layers, hidden=32, heads=4, kv_heads=2, vocab=96, seq_len=16, norm=norm, mlp=mlp, position=position
    )
    raw = {
        "model": model,
        "hardware": {"device": "cpu", "per_node": per_node},
        "train": {"global_batch": global_batch, "steps": steps, "precision": precision},
    }
    return build_plan(raw)


def block_ops(norm: str, mlp: str, position: str) -> tuple[int, int]:
    counts = []
    for layers in (1, 2):
        model = Transformer(plan_for(layers, norm, mlp, position).model)
        tokens = torch.randint(0, 96, (4, 16))
        with CountOps() as fwd:
            loss = model(tokens).float().sum()
        with CountOps() as bwd:
            loss.backward()
        counts.append((fwd.count, bwd.count))
    return counts[1][0] - counts[0][0], counts[1][1] - counts[0][1]


def step_ops(layers: int, micro_batches: int, registry) -> float:
    """Ops of one training step of the real loop, the mean over the steps of a counted run."""
    # fp32, as block_ops counts the blocks: under bf16 autocast's casts of every block would be
    # counted here as the step's (the cost model scales the blocks' ops for autocast itself)
    plan = plan_for(layers, "layernorm", "gelu", "learned", precision="fp32")
    layout = Layout(tp=1, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=8 // micro_batches)
    job = compose(plan, layout, registry)
    train(job, steps=1, quiet=True)  # warm-up: the optimizer creates its states
    with CountOps() as counted:
        # Without a checkpoint a new train() call starts again at step 0: it runs all 3 steps
        # (dividing by 2 here once made every per-step count 1.5x too large).
        records = train(job, steps=3, quiet=True)
    return counted.count / len(records)


def step_constants(registry) -> dict[str, float]:
    """The per-step tables of planc/cost/dispatch.py, from runs of 1 and 2 layers and micro-batches."""
    s11, s21, s12 = step_ops(1, 1, registry), step_ops(2, 1, registry), step_ops(1, 2, registry)
    fwd, bwd = block_ops("layernorm", "gelu", "learned")
    per_block_step = s21 - s11 - fwd - bwd  # the optimizer and gradient clipping of one block's tensors
    per_micro_batch = s12 - s11 - fwd - bwd  # embedding, head, loss of one micro-batch
    return {
        "OPS_PER_PARAMETER_TENSOR": per_block_step / GPT_BLOCK_TENSORS,
        "MICRO_BATCH_OPS": per_micro_batch,
        "STEP_OPS": s11 - per_block_step - fwd - bwd - per_micro_batch,
    }


#: Parameter tensors of the counted GPT block: 4 attention and 2 MLP linears with biases, 2 LayerNorms with biases.
GPT_BLOCK_TENSORS = 16


class CountDTensorOps(TorchDispatchMode):
    """Counts the ops called with a DTensor argument (DTensor then runs its local ops, unseen here)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor

        if any(issubclass(t, DTensor) for t in types):
            self.count += 1
        return func(*args, **(kwargs or {}))


def dtensor_ops(norm: str, mlp: str, position: str, registry, precision: str = "fp32") -> tuple[int, int, int]:
    """(forward, backward) DTensor ops of one block and the DTensor ops of one micro-batch outside
    the blocks, planc's program under TP 2 (the fake process group of :func:`_fake_world` must be up).
    ``precision`` "bf16": tensor parallelism alone runs it under autocast, whose casts of the DTensor
    weights are DTensor ops too."""
    from planc.runtime.transformer import loss_fn

    counts = []
    for layers in (1, 2):
        plan = plan_for(layers, norm, mlp, position, per_node=2, precision=precision)
        layout = Layout(tp=2, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=4)
        job = compose(plan, layout, registry)
        (model,) = job.model_parts
        tokens = torch.randint(0, 96, (4, plan.model.seq_len + 1))
        with CountDTensorOps() as fwd, job.loss_context():
            loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:], plan.model.vocab)
        with CountDTensorOps() as bwd, job.loss_context():
            loss.backward()
        counts.append((fwd.count, bwd.count))
    (f1, b1), (f2, b2) = counts
    return f2 - f1, b2 - b1, f1 + b1 - (f2 - f1) - (b2 - b1)


def _fake_world(size: int = 2) -> None:
    """One process standing for ``size`` ranks: torch's ``fake`` backend (collectives do nothing)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    os.environ.update(RANK="0", WORLD_SIZE=str(size), LOCAL_RANK="0", LOCAL_WORLD_SIZE=str(size))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)


def main() -> None:
    if "--dtensor" in sys.argv:
        _fake_world()
        registry = load_registry()
        for name, precision in (("DTENSOR_OPS", "fp32"), ("DTENSOR_OPS_AUTOCAST", "bf16")):
            print(f"{name} = {{")
            for key in itertools.product(("layernorm", "rmsnorm"), ("gelu", "swiglu"), ("learned", "rope")):
                print(f"    {key!r}: {dtensor_ops(*key, registry, precision)},")
            print("}")
        dist.destroy_process_group()
        return
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29613"))
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo")
    if "--step-only" not in sys.argv:
        print("BLOCK_OPS = {")
        for norm, mlp, position in itertools.product(("layernorm", "rmsnorm"), ("gelu", "swiglu"), ("learned", "rope")):
            print(f"    ({norm!r}, {mlp!r}, {position!r}): {block_ops(norm, mlp, position)},")
        print("}")
    for name, value in step_constants(load_registry()).items():
        print(f"{name} = {value:.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
