"""What each strategy's PyTorch wrapper adds to a step, measured on small real runs of the wrapper.

The cost model prices a step as kernels + eager ops (:mod:`planc.calibrate.dispatch`) +
collectives (:mod:`planc.calibrate.collectives`). The wrappers add host work of their own on top
(DDP's autograd hooks and bucket copies, FSDP2's pre/post forward/backward hooks and all-gather /
reduce-scatter copy-in/out, DTensor's dispatch and sharding propagation); at the CPU matrix's
sizes that dominates the step. Each is measured the same way, on every rank of the real process
group at once:

    overhead per unit = (wrapped step - plain step - the wrapper's collectives, timed bare) / units

on a stack of :data:`UNITS` units, forward and backward of one micro-batch (DDP and ``replicate``
synchronising). DDP, FSDP2's ``fully_shard`` and ``replicate`` wrap planc's own GPT blocks (16
tensors each, as in the program): FSDP2's work per unit grows with the unit's tensors (copy-out of
each gathered parameter, copy-in of each gradient), and DDP's per-tensor figure, a difference of
two steps, reads steadier over the blocks' 64 tensors than over 16; so do clipping and the
optimizer over DTensor parameters. The pipeline is measured on MLP units (``Linear(H, 4H)``,
GELU, ``Linear(4H, H)``). The
plain step is the same stack unwrapped; the collectives are timed bare at the sizes the wrapper
issues (so the cost model, which prices them from the collective fits, does not count them twice).
A negative difference (noise on a fast device) is stored as 0.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from planc.calibrate.timing import beyond_parts, median_seconds, paired_difference, repeats_for, slowest_rank
from planc.calibrate.tp_block import BATCH, SPEC, measure_tp_blocks
from planc.spec.hardware_profile import WrapperOverheads

#: Units of the measured stack; hidden size and tokens of its micro-batch (the CPU matrix's hidden 32).
UNITS = 4
HIDDEN = 32
TOKENS = 128


def _stack(device: torch.device) -> nn.Sequential:
    torch.manual_seed(0)
    units = [
        nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Linear(4 * HIDDEN, HIDDEN)) for _ in range(UNITS)
    ]
    return nn.Sequential(*units).to(device)


def _planc_blocks(device: torch.device) -> tuple[nn.Sequential, torch.Tensor]:
    """:data:`UNITS` of planc's GPT blocks at the calibration's sizes (``tp_block.SPEC``), and their input.

    FSDP2 measured on MLP units (4 tensors each) read about half of what it costs per block in the
    program (a GPT block has 16: 1.3-3.8 ms per unit against 2.0-6.6 ms on planc's blocks in the
    same launches, 2 gloo processes); the ZeRO-3 cases of the CPU matrix were under-predicted by
    +30 ... +170 % with the MLP's figure (docs/accuracy.md). DDP per tensor read 27-141 us on the
    MLP stack and 33-76 us on these blocks in the same launches (3 launches x 3 rounds)."""
    from planc.runtime.transformer import TransformerBlock
    from planc.spec.model import ModelSpec

    torch.manual_seed(0)
    spec = ModelSpec.model_validate(SPEC)
    blocks = nn.Sequential(*[TransformerBlock(spec) for _ in range(UNITS)]).to(device)
    return blocks, torch.randn(BATCH, spec.seq_len, spec.hidden, device=device)


def _step_fn(model: nn.Module, x: torch.Tensor):
    def step():
        model(x).sum().backward()
        for p in model.parameters():
            p.grad = None

    return step


def _extra(wrapped, plain, device: torch.device, budget: float) -> float:
    """Median of (``wrapped`` - ``plain``) seconds over alternating repetitions, the slowest rank's."""
    return slowest_rank(paired_difference(wrapped, plain, device, budget), device)


def _bare(fn, device: torch.device, budget: float) -> float:
    """Median seconds of ``fn``, the slowest rank's, with the same repetitions on every rank (``fn``
    runs collectives: a rank that stopped early would leave the others waiting)."""
    probe = slowest_rank(median_seconds(fn, device, repeats=1, warmup=1), device)
    repeats = repeats_for(probe, budget)
    return slowest_rank(median_seconds(fn, device, repeats=repeats, warmup=1), device)


#: Independent rounds of the wrapper measurements; each term is the median of its rounds.
#: One round's reading is heavy-tailed on a shared CPU: the same measurement read DDP at 0-169 us
#: per tensor and FSDP2 at 0.14-4.5 ms per unit in repeated calls (docs/accuracy.md, "The CPU
#: matrix"); the median of three keeps a single disturbed round out of the profile.
ROUNDS = 3


def measure_wrappers(device: torch.device, budget: float) -> WrapperOverheads:
    """Per-unit host overhead of DDP, FSDP2 (fully_shard, replicate), DTensor TP and the pipeline
    schedule over the default process group: each the median of :data:`ROUNDS` rounds."""
    rounds = [_measure_round(device, budget) for _ in range(ROUNDS)]
    medians = {name: statistics.median(getattr(r, name) for r in rounds) for name in WrapperOverheads.model_fields}
    return WrapperOverheads(**medians)


def _measure_round(device: torch.device, budget: float) -> WrapperOverheads:
    """One round of every multi-process wrapper measurement (every rank runs the same)."""
    world = dist.get_world_size()
    x = torch.randn(TOKENS, HIDDEN, device=device)
    blocks, block_input = _planc_blocks(device)
    blocks_step = _step_fn(blocks, block_input)
    block_tensors = sum(1 for _ in blocks.parameters())
    block_numel = sum(p.numel() for p in blocks.parameters())
    tp_block, tp_sp_block = measure_tp_blocks(
        device, lambda fn: _bare(fn, device, budget), lambda fn, ref: _extra(fn, ref, device, budget)
    )
    return WrapperOverheads(
        ddp_per_tensor=_ddp(blocks, block_input, blocks_step, block_tensors, block_numel, device, budget),
        fsdp_per_unit=_fsdp(blocks, block_input, blocks_step, block_numel, world, device, budget),
        replicate_per_unit=_replicate(blocks, block_input, blocks_step, block_numel, device, budget),
        tp_per_block=tp_block,
        tp_sp_per_block=tp_sp_block,
        pp_per_action=_pp(x, world, device, budget),
        dtensor_optimizer_per_tensor=_dtensor_optimizer(blocks, block_tensors, device, budget),
    )


def _ddp(plain, x, plain_step: Callable[[], None], tensors, numel, device, budget) -> float:
    """DDP as planc's program builds it (:func:`planc.strategies.ddp.runtime.wrap_ddp`): gradients
    as views into the buckets from the start, zeroed in place each step."""
    from torch.nn.parallel import DistributedDataParallel

    from planc.strategies.ddp.runtime import give_zero_gradients

    model = copy.deepcopy(plain)
    give_zero_gradients(model)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
    bucket_views = [p.grad for p in model.parameters() if p.grad is not None]

    def step():
        ddp(x).sum().backward()
        torch._foreach_zero_(bucket_views)

    t_ddp = _extra(step, plain_step, device, budget)
    grads = torch.zeros(numel, device=device)  # one bucket: the stack is far below 25 MiB
    t_reduce = _bare(lambda: dist.all_reduce(grads), device, budget)
    return max(0.0, (t_ddp - t_reduce) / tensors)


def _fsdp(plain, x, plain_step, numel, world, device, budget) -> float:
    from torch.distributed.fsdp import fully_shard

    model = copy.deepcopy(plain)
    for unit in model:
        fully_shard(unit)
    fully_shard(model)
    # Per unit: an all-gather in forward, again in backward (resharded after forward), a reduce-scatter.
    shard = -(-numel // UNITS // world)
    local, full = torch.zeros(shard, device=device), torch.zeros(shard * world, device=device)

    # torch 2.13 names them *_single (the *_tensor names warn); older torch has only *_tensor.
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)

    def unit_collectives():
        gather(full, local)
        gather(full, local)
        scatter(local, full)

    def measure() -> tuple[float, float]:
        return _extra(_step_fn(model, x), plain_step, device, budget), UNITS * _bare(unit_collectives, device, budget)

    return beyond_parts(measure) / UNITS


def _replicate(plain, x, plain_step, numel, device, budget) -> float:
    """FSDP2's ``replicate`` on each unit and the root: per unit, one gradient all-reduce."""
    from torch.distributed._composable.replicate_with_fsdp import replicate
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    model = copy.deepcopy(plain)
    for unit in model:
        replicate(unit, mesh=mesh)
    replicate(model, mesh=mesh)
    t_replicate = _extra(_step_fn(model, x), plain_step, device, budget)
    grads = torch.zeros(-(-numel // UNITS), device=device)
    t_comm = UNITS * _bare(lambda: dist.all_reduce(grads), device, budget)
    return max(0.0, (t_replicate - t_comm) / UNITS)


def _dtensor_optimizer(plain, tensors: int, device, budget) -> float:
    """Gradient clipping and AdamW's step over the FSDP2-wrapped ``plain`` blocks' DTensor parameters
    against the same over the plain blocks' tensors, per tensor, as planc's step runs them
    (:mod:`planc.runtime.grad_norm`: the norm worked on the local shards, then reduced over the
    shards; the rescale; the step). What remains of DTensor's cost there is reading the shards and
    the fused step's dispatch per parameter group. Part of it is once per step, not per tensor:
    measured on planc's GPT blocks (64 tensors, about what the CPU matrix's models hold) rather
    than the 16 of the MLP stack, which read 0.14 ms per tensor where the blocks read 0.06 (with
    clipping through DTensor; 0.035 since). The norm's one scalar all-reduce, which the cost model
    prices as a collective, is timed bare and taken off. The gradients are zeros: the host work,
    not the values, is measured."""
    from torch.distributed.fsdp import fully_shard

    from planc.runtime.grad_norm import clip_to_norm, grad_norm
    from planc.runtime.optim import runs_fused

    sharded = copy.deepcopy(plain)
    for unit in sharded:
        fully_shard(unit)
    fully_shard(sharded)

    def optimizer_step(model: nn.Module) -> Callable[[], None]:
        params: list[torch.Tensor] = list(model.parameters())
        for p in params:
            p.grad = torch.zeros_like(p)
        # The kernel planc's runtime takes (fused on CUDA and CPU: DTensor dispatches once per
        # group instead of per op and tensor).
        fused = True if runs_fused(params) else None
        optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=fused)

        def step() -> None:
            norm = grad_norm(params, 2.0, device=device)
            clip_to_norm(params, 1.0, norm)
            optimizer.step()

        return step

    dtensor_step, plain_step = optimizer_step(sharded), optimizer_step(copy.deepcopy(plain))
    scalar = torch.zeros(1, device=device)
    norm_all_reduce = _bare(lambda: dist.all_reduce(scalar), device, budget)
    return max(0.0, _extra(dtensor_step, plain_step, device, budget) - norm_all_reduce) / tensors


#: Micro-batches of the measured pipeline step.
MICRO_BATCHES = 4


def _pp(x, world, device, budget) -> float:
    """GPipe over every rank, ``UNITS`` units per stage: the step less what the cost model prices
    (``(M + p - 1)`` stage slots of forward + backward, one send/recv per micro-batch each way),
    per action (``2 M`` per rank: each micro-batch's forward and backward)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    rank = dist.get_rank()
    stage_module = _stack(device)
    slot = _step_fn(stage_module, x)

    def slots():  # what the cost model prices: (M + p - 1) stage slots of forward + backward
        for _ in range(MICRO_BATCHES + world - 1):
            slot()

    stage = PipelineStage(stage_module, rank, world, device)
    schedule = ScheduleGPipe(stage, n_microbatches=MICRO_BATCHES, loss_fn=lambda out, target: out.sum())
    batch = torch.cat([x] * MICRO_BATCHES)

    def step():
        if rank == 0:
            schedule.step(batch)
        elif rank == world - 1:
            schedule.step(target=batch)
        else:
            schedule.step()
        for p in stage_module.parameters():
            p.grad = None

    t_pp = _extra(step, slots, device, budget)
    t_p2p = 2 * MICRO_BATCHES * _bare(lambda: _ring_exchange(x, rank, world), device, budget)
    return max(0.0, (t_pp - t_p2p) / (2 * MICRO_BATCHES))


def _ring_exchange(x: torch.Tensor, rank: int, world: int) -> None:
    """Each rank sends an activation to its next neighbour and receives one from its previous."""
    received = torch.empty_like(x)
    ops = [
        dist.P2POp(dist.isend, x, (rank + 1) % world),
        dist.P2POp(dist.irecv, received, (rank - 1) % world),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
