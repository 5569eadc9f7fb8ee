"""Host time the strategies' PyTorch wrappers add, at the per-unit costs ``planc calibrate`` measured.

Beside the plain model's eager ops (:mod:`planc.cost.dispatch`) and the collectives
(:mod:`planc.cost.comm`), each wrapper runs Python of its own per unit it wraps; the profile
holds what one unit costs (:class:`~planc.spec.hardware_profile.WrapperOverheads`, measured by
``planc.calibrate.wrappers``) and this module counts the units of a layout:

- DDP (and ZeRO-1, which runs DDP): every parameter tensor of a rank, once per step (the
  reducer's hooks and bucket copies run on the synchronising micro-batch; ``no_sync`` skips them);
- FSDP2 ``fully_shard``: every unit (each block, the root), per all-gather and reduce-scatter it
  runs (the copies around each collective; under a pipeline, gathering once and reducing once per
  step, far fewer than per micro-batch); bf16 DDP's ``replicate``: every unit, per micro-batch;
- DTensor TP: every block of a rank, per micro-batch, at the cost measured on planc's own GPT
  block with its TP plan, with or without sequence parallelism, per DTensor op: scaled by the
  plan's block's DTensor ops over the GPT block's (:data:`~planc.cost.dispatch.DTENSOR_OPS`);
  and the embedding, head and loss's DTensor ops at the same cost per op;
- the pipeline schedule: every action of a rank (each of its v chunks' forward and backward of
  each micro-batch; zero-bubble splits the backward in two, input and weight gradients);
- zero-bubble's split backward: every block of a rank, per micro-batch (measured on one process
  on the GPT block beyond one whole backward; scaled by parameter groups);
- activation checkpointing: every block of a rank, per micro-batch, full or selective (measured
  on one process on the GPT block, beyond the rerun forward the recompute pass prices; scaled by
  aten op count: its policy runs per op).
- the optimizer step and clipping over DTensor parameters (FSDP2, ``replicate``, TP): every
  parameter tensor of a rank, once per step, beyond the plain-tensor step the optimizer term
  prices. Each strategy whose parameters are DTensors adds it; the term is added once however
  many of them a layout combines (:func:`with_dtensor_optimizer`).

Without a profile (or with one that predates these fields) every cost is 0 and no term is added:
data-sheet predictions, the GPU ones included, do not move. On a GPU this host time overlaps the
kernels; it is added on the critical path here, as :func:`planc.cost.dispatch.combine` adds the
eager ops' on a CPU, and only when measured.
"""

from __future__ import annotations

from planc.cost.context import CostContext
from planc.cost.dispatch import (
    BLOCK_OPS,
    DTENSOR_OPS,
    block_ops,
    dtensor_ops,
    parameter_groups_per_block,
    tensors_per_block,
)
from planc.cost.estimate import Estimate
from planc.spec.hardware_profile import WrapperOverheads

_NONE = WrapperOverheads()


def measured_overheads(ctx: CostContext) -> WrapperOverheads:
    """The profile's per-unit wrapper costs, or all zeros without a profile."""
    measured = ctx.device.measured
    return measured.wrappers if measured is not None else _NONE


def tensors_per_rank(ctx: CostContext) -> int:
    """Parameter tensors on the busiest pipeline rank: blocks, embeddings, final norm, head."""
    model = ctx.model
    norm = 2 if model.norm == "layernorm" else 1
    counts = []
    for st in ctx.stages:
        edges = st.embedding * (1 + (model.position == "learned")) + st.head * (norm + (not model.tie_embeddings))
        counts.append(st.layers * tensors_per_block(model) + edges)
    return max(counts)


def with_wrapper_time(est: Estimate, name: str, seconds: float, *, per_micro_batch: bool = False) -> Estimate:
    """``est`` with ``seconds`` of wrapper host time under ``name`` (unchanged when 0);
    ``per_micro_batch``: spent in every micro-batch's slot, so a pipeline's bubble lasts longer too."""
    return est.with_time(name, seconds, per_micro_batch=per_micro_batch) if seconds > 0 else est


def ddp_seconds(ctx: CostContext) -> float:
    return tensors_per_rank(ctx) * measured_overheads(ctx).ddp_per_tensor


#: Collectives per unit per micro-batch in the FSDP2 stand-in ``planc calibrate`` measures
#: (``fully_shard`` resharding after forward: an all-gather in forward, again in backward, and a
#: reduce-scatter).
FSDP_MEASURED_COLLECTIVES = 3


def fsdp_seconds(ctx: CostContext, units: int, collectives: int) -> float:
    """FSDP2's host work for ``units`` units that each run ``collectives`` all-gathers and
    reduce-scatters per step: the measured per-unit cost per collective. FSDP2's work is the
    copy-in and copy-out of every tensor around each collective, not its hooks: on 2 gloo ranks, 5
    GPT-block units and 4 micro-batches ran about 1 ms beyond the bare step per unit and collective
    whether resharding after forward (60 collectives per step), not (40), or gathering once and
    reducing once per step as under a pipeline (10)."""
    per_collective = measured_overheads(ctx).fsdp_per_unit / FSDP_MEASURED_COLLECTIVES
    return units * collectives * per_collective


def replicate_seconds(ctx: CostContext, units: int) -> float:
    return ctx.micro_batches * units * measured_overheads(ctx).replicate_per_unit


#: The block ``planc calibrate`` measures DTensor TP and checkpointing on (planc's GPT block:
#: ``planc.calibrate.tp_block.SPEC``; a test holds the two together), as (norm, mlp, position).
MEASURED_BLOCK = ("layernorm", "gelu", "learned")


def per_op_scale(ctx: CostContext) -> float:
    """The plan's block's aten ops over the measured block's (:data:`planc.cost.dispatch.BLOCK_OPS`,
    forward and backward): selective checkpointing's policy runs once per op, so a Llama block
    (RMSNorm, SwiGLU, RoPE: 250 ops) costs 1.7x the measured GPT block (148)."""
    model = ctx.model
    return sum(block_ops(model)) / sum(BLOCK_OPS[MEASURED_BLOCK])


def tp_seconds(ctx: CostContext) -> float:
    """DTensor's per-op cost over a rank's DTensor ops (:func:`~planc.cost.dispatch.dtensor_ops`):
    the measured GPT block's cost divided by its 106 DTensor ops (fp32, as calibrate runs it), times
    the plan's block's -- under autocast (tensor parallelism over fp32 parameters) its weights'
    casts too -- and under recomputation the forward's once more (the rerun dispatches them
    again). The embedding, final norm, head and loss run on DTensors too (vocabulary-parallel,
    loss parallelism): their DTensor ops per micro-batch at the same cost, on the pipeline rank
    that holds either end (all of them on such a rank: an overestimate of the edges under
    pipelining, which splits them in two)."""
    w = measured_overheads(ctx)
    per_block = w.tp_sp_per_block if ctx.layout.sequence_parallel else w.tp_per_block
    measured_forward, measured_backward, _ = DTENSOR_OPS[MEASURED_BLOCK]
    per_op = per_block / (measured_forward + measured_backward)
    forward, backward, edge_ops = dtensor_ops(ctx.model, ctx.autocast)
    rerun = forward if ctx.layout.recompute != "none" else 0
    block_cost = per_op * (forward + backward + rerun)
    edges = per_op * edge_ops
    per_micro_batch = max(st.layers * block_cost + (edges if st.embedding or st.head else 0.0) for st in ctx.stages)
    return ctx.micro_batches * per_micro_batch


def pp_seconds(ctx: CostContext) -> float:
    lay = ctx.layout
    passes = 3 if lay.schedule == "zero-bubble" else 2
    return passes * ctx.micro_batches * lay.virtual_stages * measured_overheads(ctx).pp_per_action


def split_backward_seconds(ctx: CostContext) -> float:
    """Zero-bubble's split backward, per block and micro-batch on the busiest rank: the measured
    GPT block's cost scaled by the plan's block's parameter groups (the weight half walks the
    graph once per group: a linear with its bias, a norm), which the weight pass of torch's
    ``stage_backward_weight`` visits one by one."""
    groups = parameter_groups_per_block(ctx.model.mlp) / parameter_groups_per_block(MEASURED_BLOCK[1])
    per_block = measured_overheads(ctx).split_backward_per_block * groups
    return ctx.micro_batches * max(st.layers for st in ctx.stages) * per_block


def recompute_seconds(ctx: CostContext) -> float:
    """``checkpoint_wrapper``'s own work (full) or with planc's selective policy, per block and
    micro-batch, beyond the rerun forward the recompute pass prices; under autocast its own
    measurement where the profile has one."""
    mode, w = ctx.layout.recompute, measured_overheads(ctx)
    per_block = {"full": w.checkpoint_per_block, "selective": w.selective_per_block}.get(mode, 0.0)
    if ctx.autocast:
        under_autocast = {"full": w.checkpoint_per_block_autocast, "selective": w.selective_per_block_autocast}
        per_block = under_autocast.get(mode, 0.0) or per_block  # 0: a profile that did not measure it
    return ctx.micro_batches * max(st.layers for st in ctx.stages) * per_block * per_op_scale(ctx)


#: The name of the DTensor optimizer term (one per estimate).
DTENSOR_OPTIMIZER = "optimizer and clipping over DTensor parameters (measured)"


def with_dtensor_optimizer(est: Estimate, ctx: CostContext) -> Estimate:
    """``est`` with the host time of clipping and the optimizer step over DTensor parameters: added by
    every strategy that makes the parameters DTensors, counted once (FSDP over a tensor-parallel
    mesh is still one optimizer step)."""
    if any(term.name == DTENSOR_OPTIMIZER for term in est.other):
        return est
    seconds = tensors_per_rank(ctx) * measured_overheads(ctx).dtensor_optimizer_per_tensor
    return with_wrapper_time(est, DTENSOR_OPTIMIZER, seconds)
