"""The plan-time cost pass of ``bf16`` (pure; no torch)."""

from __future__ import annotations

from planc.cost.context import CostContext
from planc.cost.estimate import Estimate

#: Bytes per parameter and micro-batch that autocast moves outside the GEMMs: the fp32 -> bf16
#: weight cast in forward (read 4, write 2) and, in backward, the cast of the bf16 weight
#: gradient back to fp32 (``ToCopyBackward``: read 2, write 4). On an H100 the casts ran as
#: separate copy kernels, ``bfloat16_copy_kernel_cuda`` and ``direct_copy_kernel_cuda``
#: (docs/gpu.md), not fused with the accumulation below.
AUTOCAST_CAST_BYTES_PER_PARAM = 6 + 6
#: Adding that fp32 gradient into an existing fp32 ``.grad`` (read 4, read 4, write 4): every
#: micro-batch but the first, whose gradient becomes ``.grad`` -- and the first too where the
#: gradients live in DDP's buckets, which the step zeroes in place (ZeRO-1, DDP under autocast).
GRADIENT_ACCUMULATE_BYTES_PER_PARAM = 12


def cost(ctx: CostContext, est: Estimate, options: object = None) -> Estimate:
    """bf16 mixed precision. With fp32 parameters under ``torch.autocast`` (DDP, ZeRO-1) every
    weight is cast to bf16 for its GEMM and the copy is saved for backward: 2 bytes per
    parameter while a step runs, and the casts and fp32 gradient accumulation cost
    :data:`AUTOCAST_CAST_BYTES_PER_PARAM` of memory traffic per micro-batch, and the fp32
    gradients' accumulation :data:`GRADIENT_ACCUMULATE_BYTES_PER_PARAM`. FSDP's bf16 parameters
    (ZeRO-2/3) need neither. The bf16 compute rate and 2-byte activations are already in the
    context's dtypes."""
    if not autocast_copy_bytes(ctx, 0):
        return est
    params = max(st.params for st in ctx.stages)
    m = ctx.micro_batches
    accumulations = m if ctx.layout.dp > 1 else m - 1
    per_param = m * AUTOCAST_CAST_BYTES_PER_PARAM + accumulations * GRADIENT_ACCUMULATE_BYTES_PER_PARAM
    casts = per_param * params / ctx.device.memory_rate
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
