"""The plan-time cost pass of ``bf16`` (pure; no torch)."""

from __future__ import annotations

from planc.cost.context import CostContext
from planc.cost.estimate import Estimate

#: Bytes per parameter and micro-batch that autocast moves outside the GEMMs: the fp32 -> bf16
#: weight cast (read 4, write 2) and folding the bf16 weight gradient into the fp32 ``.grad``
#: (read 2, read 4, write 4).
AUTOCAST_BYTES_PER_PARAM = 6 + 10


def cost(ctx: CostContext, est: Estimate, options: object = None) -> Estimate:
    """bf16 mixed precision. With fp32 parameters under ``torch.autocast`` (DDP, ZeRO-1) every
    weight is cast to bf16 for its GEMM and the copy is saved for backward: 2 bytes per
    parameter while a step runs, and the casts and fp32 gradient accumulation cost
    :data:`AUTOCAST_BYTES_PER_PARAM` of memory traffic per micro-batch. FSDP's bf16 parameters
    (ZeRO-2/3) need neither. The bf16 compute rate and 2-byte activations are already in the
    context's dtypes."""
    if not autocast_copy_bytes(ctx, 0):
        return est
    params = max(st.params for st in ctx.stages)
    casts = ctx.micro_batches * AUTOCAST_BYTES_PER_PARAM * params / ctx.device.memory_rate
    return est.updated(
        stage_fn=lambda s: s.with_transient("bf16 weight copies (autocast)", autocast_copy_bytes(ctx, s.rank)),
        compute=est.compute + casts,
    )


def autocast_copy_bytes(ctx: CostContext, rank: int) -> float:
    """The bf16 copies autocast makes of pipeline rank ``rank``'s fp32 weights and saves for
    backward (0 when the parameters are not fp32 under bf16 autocast). Each block's copies go
    with its backward: by the embedding's backward, at the step's end, they are gone."""
    if ctx.plan.train.precision != "bf16" or ctx.state_bytes.working < 4:
        return 0.0
    return 2.0 * ctx.stage(rank).params
