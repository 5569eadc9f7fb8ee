"""``planc verify --simulate``: one rank of the plan's real world, one training step, no memory.

For a chosen rank, in this process (:mod:`planc.verify.fake_world`): the ``fake`` process group
at the plan's world size; planc's own job -- the same ``Job.create``, the same strategy ``apply``
functions in composition order, ``init_weights``, ``build_optimizer`` the emitted program calls
(:func:`planc.runtime.compose.compose_on_meta`) -- allocated as fake tensors; and one optimizer
step (:func:`planc.runtime.step.optimizer_step`: every micro-batch of gradient accumulation or of
the pipeline schedule, clipping, the optimizer) on a fake batch. A pipelined job's schedule reads
its peers' votes and shapes, which :mod:`planc.verify.fake_pipeline` answers; its first step runs
untracked and the second is measured. Measured:

- model-state bytes after the step (:func:`planc.verify.model_states.model_state_bytes`, the
  function the real probe uses: each rank's local shard storage);
- the step's peak, by torch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``), which
  weighs every storage alive -- parameters, gradients, optimizer states, activations, FSDP's
  gathered and reduce-scatter buffers, temporaries -- with its per-module statistics reset before
  each micro-batch's forward (it refuses a second root forward in one iteration otherwise).

Nothing is computed: the loss and gradient norm are fake and never read (:func:`optimizer_step`
returns them as tensors), and collectives return at once. What this cannot see: the CUDA
context, the caching allocator's rounding and fragmentation, NCCL's buffers -- the prediction is
compared net of those terms (:func:`planc.verify.predicted.peak_net_bytes`).
"""

from __future__ import annotations

import resource
import time

import torch

from planc.spec import Layout, Plan

#: The sections of ``planc verify``'s comparison a simulation measures (no traffic, no time).
SIMULATED = ("model states", "peak memory")


class CannotSimulate(Exception):
    """The plan's program failed under fake tensors (``hint``: what to do)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def simulate(plan: Plan, layout: Layout, registry, ranks: list[int]) -> dict:
    """Simulate each of ``ranks`` and put the cost model's prediction beside what it held: the
    result ``planc verify --simulate`` prints and saves (the shape of ``planc verify``'s)."""
    from planc.verify.predicted import estimate_for, peak_net_bytes, predicted_for_rank, stage_for
    from planc.verify.report import Row, rows_for_rank

    ctx, estimate = estimate_for(plan, layout, registry)
    records: list[dict] = []
    rows: list[Row] = []
    for rank in ranks:
        try:
            record = simulate_rank(plan, layout, registry, rank)
        except Exception as exc:  # an op torch cannot run on fake tensors: say where, keep the cause
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise CannotSimulate(
                f"rank {rank}: {type(exc).__name__}: {first_line}",
                hint="a strategy or op that torch cannot run on fake tensors; planc verify (a real run) still works",
            ) from exc
        pp_rank, dp_rank = record["coordinates"]["pp"], record["coordinates"]["dp"]
        predicted = predicted_for_rank(ctx, estimate, pp_rank, dp_rank)
        predicted["peak_bytes"] = peak_net_bytes(stage_for(ctx, estimate, pp_rank, dp_rank)[0])
        records.append(record)
        rows.extend(row for row in rows_for_rank(record, predicted) if row.section in SIMULATED)
    return {
        "simulated": True,
        "layout": layout.model_dump(mode="json"),
        "describe": layout.describe(),
        "world_size": layout.dims.world_size,
        "device": "fake tensors",
        "rows": [row.as_dict() for row in rows],
        "ranks": records,
    }


def refusal(plan: Plan, layout: Layout, registry) -> str | None:
    """Why torch cannot run this layout's program on fake tensors, or None when it can.

    The limits are torch's (issue 13 asks to say where it does not work). DistributedDataParallel
    (fp32 DDP, ZeRO-1 in any precision) runs with :func:`planc.verify.fake_world.ddp_on_fake_tensors`
    and :func:`~planc.verify.fake_world.completing_comm_hooks`, but not under pipelining: there
    planc turns on its search for unused parameters, whose reducer reads a count on the host in
    the middle of backward (``Tensor.item()``), which fake tensors have not. A plugin's DDP
    communication hook (``planc-powersgd``) waits on the ``fake`` backend's futures, which hold no
    tensor. Pipeline schedules, which read their peers' votes and shapes, run with
    :mod:`planc.verify.fake_pipeline` standing in for the peers.
    """
    for strategy in registry.active(plan, layout):
        wraps_ddp = strategy.name == "zero1" or (
            strategy.name == "ddp" and not _uses_replicate(plan, strategy.options_for(plan, layout))
        )
        if wraps_ddp and layout.pp > 1:
            return (
                "under pipelining DistributedDataParallel looks for unused parameters, reading a count on the "
                "host in the middle of backward, which fake tensors have not; fp32 DDP and ZeRO-1 are "
                "simulated without pipelining (bf16 DDP, ZeRO-2 and ZeRO-3 with it too)"
            )
    return None


def _uses_replicate(plan: Plan, options) -> bool:
    """Whether ``ddp`` takes the composable ``replicate`` (bf16) over DistributedDataParallel."""
    return plan.train.precision == "bf16" and bool(getattr(options, "bf16_weights", False))


def default_ranks(layout: Layout) -> list[int]:
    """The ranks whose memory differs: data-parallel rank 0 of the first and last pipeline stage (and
    of one middle stage: they are all alike), and under ZeRO-1 the last data-parallel rank too
    (ZeroRedundancyOptimizer's greedy partition is uneven). Tensor-parallel ranks are alike.
    Ranks are numbered as the ("pp", "dp", "tp") mesh lays them out, tp innermost."""
    stages = sorted({0, min(1, layout.pp - 1), layout.pp - 1})
    dp_ranks = sorted({0, layout.dp - 1}) if layout.zero == 1 else [0]
    return [(pp * layout.dp + dp) * layout.tp for pp in stages for dp in dp_ranks]


def simulate_rank(plan: Plan, layout: Layout, registry, rank: int) -> dict:
    """Build ``plan``'s job for ``rank`` of ``layout``'s world under fake tensors, run one step,
    and return what it held: ``{"rank", "coordinates", "model_states", "peak", "seconds"}``."""
    from planc.runtime.compose import compose_on_meta
    from planc.verify.cuda_kernels import cuda_optimizers
    from planc.verify.fake_pipeline import sends_hold_their_tensors
    from planc.verify.fake_world import completing_comm_hooks, ddp_on_fake_tensors, fake_process_group, fake_tensors
    from planc.verify.model_states import model_state_bytes

    began = time.perf_counter()
    plan = simulation_plan(plan)
    with fake_process_group(rank, layout.dims.world_size):
        job = compose_on_meta(plan, layout, registry, device="cpu")  # mesh and meta model: outside fake mode
        with fake_tensors(), sends_hold_their_tensors():
            with ddp_on_fake_tensors():
                job.init_weights()
            completing_comm_hooks(job.model_parts)
            job.build_optimizer()
            if plan.hardware.device != "cpu":  # the CUDA program's fused optimizer, not the CPU loop
                cuda_optimizers(job.optimizers)
            batch = torch.zeros((plan.train.global_batch // layout.dp, plan.model.seq_len + 1), dtype=torch.long)
            if job.schedule is not None:
                _first_pipeline_step(job, batch)
            else:
                _create_optimizer_states(job)
            peak = _tracked_step(job, batch)
            states = model_state_bytes(job)
        coordinates = job.coordinates
    return {
        "rank": rank,
        "coordinates": coordinates,
        "model_states": states,
        "peak": peak,
        "seconds": time.perf_counter() - began,
        "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def simulation_plan(plan: Plan) -> Plan:
    """The plan as simulated: pretrained weights are not read (fake tensors hold no values; their
    memory is the same as a seeded init's)."""
    if plan.model.init != "pretrained":
        return plan
    return plan.model_copy(update={"model": plan.model.model_copy(update={"init": "random"})})


def _create_optimizer_states(job) -> None:
    """Let each optimizer create its states, as the first step of a run does (the real verify's
    warm-up step), so that the tracked step holds them throughout as every later step does -- not
    only from its end. An optimizer step on zero gradients: cheaper than a whole warm-up step, and
    fake tensors hold no values for the zeros to change."""
    from planc.runtime.step import clear_gradients

    for param in job.local_parameters:
        if param.grad is None:  # DDP's gradients are already there, views into its buckets
            param.grad = torch.zeros_like(param)
    for optimizer in job.optimizers:
        optimizer.step()
    clear_gradients(job)


def _first_pipeline_step(job, batch: torch.Tensor) -> None:
    """A pipelined job's first step, untracked: the schedule infers its stages' metadata on it
    (:mod:`planc.verify.fake_pipeline` answers for the peers) -- a forward and backward of its own,
    under ``autograd.grad``, which torch's module tracker cannot follow -- and the optimizer creates
    its states. The tracked step is then the second, as every later one."""
    from planc.runtime.step import optimizer_step
    from planc.verify.fake_pipeline import stand_in_peers

    stand_in_peers(job)
    optimizer_step(job, batch)


def _tracked_step(job, batch: torch.Tensor) -> dict:
    """One optimizer step under the step's peak tracker (:mod:`planc.verify.peak_tracker`); its peak
    on the job's device, by category. RMSNorm keeps what its CUDA kernel keeps
    (:mod:`planc.verify.cuda_kernels`), not its CPU decomposition."""
    from planc.runtime.step import optimizer_step
    from planc.verify.cuda_kernels import cuda_rms_norm
    from planc.verify.peak_tracker import peak_by_category, tracking_the_step

    with tracking_the_step(job) as tracker, cuda_rms_norm(job.model_parts):
        optimizer_step(job, batch)
    return peak_by_category(tracker, job.device) | {
        "source": "torch.distributed._tools.mem_tracker.MemTracker under FakeTensorMode"
    }
