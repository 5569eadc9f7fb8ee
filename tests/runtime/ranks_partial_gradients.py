"""The ranks' side of tests/runtime/test_partial_gradients.py (run under torchrun by tests/ranks.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from planc.runtime.optim import reduce_partial_gradients


def sum_partial_gradients(_payload) -> dict:
    """Two replicated parameters (a gain of 3, a bias of 2) meet a sequence-sharded input, as the
    norms do under sequence parallelism: their gradients come out ``Partial``. Returns what rank 0
    saw after :func:`reduce_partial_gradients`, and how many all-reduces it issued."""
    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    gain = nn.Parameter(distribute_tensor(torch.tensor([1.0, 2.0, 3.0]), mesh, [Replicate()]))
    bias = nn.Parameter(distribute_tensor(torch.tensor([0.5, -0.5]), mesh, [Replicate()]))
    # global rows r = 0 .. 2 * world - 1, row r holding r + 1 everywhere; each rank holds two rows
    rows = torch.arange(2 * world, dtype=torch.float32).add(1).unsqueeze(1)
    x = distribute_tensor(rows.expand(-1, 3).contiguous(), mesh, [Shard(0)])
    y = distribute_tensor(rows.expand(-1, 2).contiguous(), mesh, [Shard(0)])
    ((x * gain).sum() + (y * y * bias).sum()).backward()
    before = [str(p.grad.placements[0]) for p in (gain, bias)]
    calls = []
    original = dist.all_reduce

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    dist.all_reduce = counted
    try:
        reduced = reduce_partial_gradients([gain, bias])
    finally:
        dist.all_reduce = original
    assert all(isinstance(p.grad, DTensor) for p in (gain, bias))
    return {
        "before": before,
        "after": [str(p.grad.placements[0]) for p in (gain, bias)],
        "reduced": reduced,
        "all_reduces": len(calls),
        "gain_grad": gain.grad.to_local().tolist(),
        "bias_grad": bias.grad.to_local().tolist(),
        "world": world,
    }
