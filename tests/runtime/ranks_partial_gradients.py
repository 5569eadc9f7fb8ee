"""The ranks' side of tests/runtime/test_partial_gradients.py (run under torchrun by tests/ranks.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from planc.runtime.optim import reduce_partial_gradients


@contextlib.contextmanager
def counting_all_reduces() -> Iterator[list]:
    """For the duration, ``torch.distributed.all_reduce`` appends to the list it yields."""
    calls: list = []
    original = dist.all_reduce

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    dist.all_reduce = counted
    try:
        yield calls
    finally:
        dist.all_reduce = original


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
    with counting_all_reduces() as calls:
        reduced = reduce_partial_gradients([gain, bias])
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


def sum_partial_shards(_payload) -> dict:
    """A LayerNorm under ``SequenceParallel``, localized as DDP needs it (local shards behind DTensor
    views, :func:`planc.runtime.local_shards.localize_dtensor_parameters`): its gain's gradient
    stays this rank's partial sum through backward, then one all-reduce sums both parameters'."""
    from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

    from planc.runtime.local_shards import localize_dtensor_parameters
    from planc.runtime.optim import sum_in_place

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    norm = nn.LayerNorm(4)
    parallelize_module(norm, mesh, SequenceParallel())
    partial: list = []
    specs: dict = {}
    localize_dtensor_parameters(norm, specs, partial)
    rank = dist.get_rank()
    # one sequence of 2 * world positions; this rank's shard of it, [1, 2, 4]
    torch.manual_seed(0)
    full = torch.randn(1, 2 * world, 4)
    mine = DTensor.from_local(full[:, 2 * rank : 2 * rank + 2], mesh, [Shard(1)])
    norm(mine).to_local().pow(2).sum().backward()
    local_gain = norm.weight.grad.clone()
    with counting_all_reduces() as calls:
        sum_in_place([p.grad for p in partial], [mesh.get_group(0)])
    # the reference: the same norm on the whole sequence, one process's arithmetic
    reference = nn.LayerNorm(4)
    reference(full).pow(2).sum().backward()
    return {
        "partial": len(partial),
        "all_reduces": len(calls),
        "local_is_partial": not torch.allclose(local_gain, reference.weight.grad),
        "summed": torch.allclose(norm.weight.grad, reference.weight.grad, atol=1e-6)
        and torch.allclose(norm.bias.grad, reference.bias.grad, atol=1e-6),
    }
