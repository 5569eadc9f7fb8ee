"""What DTensor tensor (and sequence) parallelism adds to one of planc's own transformer blocks.

DTensor's cost is per DTensor op (dispatch, sharding propagation, redistribution bookkeeping), and
which ops of a block run on DTensors depends on the plan: plain TP turns the linears' inputs into
DTensors, sequence parallelism the norms and the gathers around them too. So this measures the
real thing rather than a stand-in: planc's ``TransformerBlock`` (GPT: LayerNorm, GELU, learned
positions; hidden 32, 4 heads, 16 tokens x 8 sequences, the CPU matrix's sizes) with
``planc.strategies.tensor_parallel.runtime.block_plan`` applied over every rank, forward and
backward, less the same block unsharded and less its 4 activation collectives timed bare
(all-reduces without SP; all-gather / reduce-scatter pairs with SP).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from planc.calibrate.timing import beyond_parts
from planc.spec.model import ModelSpec

SPEC = dict(layers=1, hidden=32, heads=4, vocab=96, seq_len=16)
BATCH = 8


def measure_tp_blocks(device: torch.device, bare, extra) -> tuple[float, float]:
    """(plain TP, TP + SP) host seconds per block per micro-batch; ``bare(fn)`` times ``fn`` on
    every rank, ``extra(fn, ref)`` the seconds ``fn`` takes beyond ``ref``."""
    from planc.runtime.transformer import TransformerBlock

    torch.manual_seed(0)
    spec = ModelSpec.model_validate(SPEC)
    block = TransformerBlock(spec).to(device)
    x = torch.randn(BATCH, spec.seq_len, spec.hidden, device=device)
    plain = _step(block, x)
    return (
        _sharded(block, x, False, plain, device, bare, extra),
        _sharded(block, x, True, plain, device, bare, extra),
    )


def _step(block, x):
    def step():
        block(x).sum().backward()
        for p in block.parameters():
            p.grad = None

    return step


def _sharded(block, x, sequence_parallel: bool, plain, device, bare, extra) -> float:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    from planc.strategies.tensor_parallel.runtime import block_plan

    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))
    sharded = copy.deepcopy(block)
    plan = block_plan(sequence_parallel)
    del plan["feed_forward.w3"]  # GELU MLP: no gate matrix
    parallelize_module(sharded, mesh, plan)
    local = x.chunk(world, dim=1)[dist.get_rank()].contiguous() if sequence_parallel else x
    full = torch.zeros(x.numel(), device=device)
    part = torch.zeros(x.numel() // world, device=device)
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)

    def measure() -> tuple[float, float]:
        t_sharded = extra(_step(sharded, local), plain)
        if sequence_parallel:
            return t_sharded, 2 * bare(lambda: (gather(full, part), scatter(part, full)))
        return t_sharded, 4 * bare(lambda: dist.all_reduce(full))

    return beyond_parts(measure)
