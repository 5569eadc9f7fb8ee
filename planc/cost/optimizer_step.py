"""The optimizer step and gradient clipping: what a rank's step costs after its last backward.

Two parts, combined as every other piece of work is (:func:`planc.cost.dispatch.combine`: one
after the other on a CPU, the slower of the two on a GPU):

- the kernels' memory traffic over the parameters the rank steps (:data:`OPTIMIZER_STEP_BYTES`),
  which ZeRO and FSDP divide over the ranks that shard the states;
- the host's: the step's own ops (:data:`planc.cost.dispatch.STEP_OPS` at the profile's cost per
  op) and, where ``planc calibrate`` measured them (:mod:`planc.calibrate.step_tensors`),
  clipping's and the optimizer's work per parameter tensor -- a CPU has no multi-tensor kernels,
  so its ``foreach`` ops and fused AdamW loop over the tensors. Clipping covers every tensor the
  rank holds; the optimizer those it steps: torch's ``ZeroRedundancyOptimizer`` deals each tensor
  whole to one rank, while FSDP's ranks each step a shard of every tensor. The host part is not
  divided by the sharding (until 2026-11-29 it was, with the traffic).
"""

from __future__ import annotations

from planc.cost.compute import Device
from planc.cost.context import CostContext
from planc.cost.dispatch import combine, step_host_ops
from planc.cost.wrappers import measured_overheads, tensors_per_rank

#: Bytes per parameter the optimizer step reads and writes (fp32), by kernel
#: (:attr:`~planc.cost.profile.RuntimeProfile.optimizer_kernel`), gradient-norm clipping included
#: (``clip_grad_norm_``: a norm that reads the gradients, 4, and a multiply that rescales them,
#: 8, which torch always runs, to avoid a host sync).
#:
#: - fused: Adam/AdamW reads param, grad, m, v and writes param, m, v (7 x 4 = 28); SGD with
#:   momentum reads param, grad, momentum and writes param, momentum (5 x 4 = 20).
#: - foreach: torch's multi-tensor AdamW (``_multi_tensor_adam``, lr a float) makes nine passes:
#:   decay (r/w param, 8), ``lerp_`` of m (12), v scaled in place (8), grad scaled into a temporary
#:   (8), ``addcmul_`` into v (16), sqrt of v into a temporary (8), divide (8), add eps (8) and
#:   ``addcdiv_`` into param (16): 92. Measured on an H100 for 1.92 B parameters: 64.9 ms of
#:   ``multi_tensor_apply`` kernels against 104 B/param at the measured 2.94 TB/s, 68 ms
#:   (docs/gpu.md). SGD with momentum: ``mul_`` + ``add_`` of the buffer (20) and the update (12): 32.
OPTIMIZER_STEP_BYTES = {
    "fused": {"adam": 28 + 12, "adamw": 28 + 12, "sgd": 20 + 12},
    "foreach": {"adam": 92 + 12, "adamw": 92 + 12, "sgd": 32 + 12},
}


def optimizer_step_seconds(
    params: float, optimizer: str, device: Device, host_seconds: float = 0.0, kernel: str = "fused"
) -> float:
    """Memory-bound optimizer step over ``params`` parameters held by this device, beside
    ``host_seconds`` of the host's own work."""
    traffic = OPTIMIZER_STEP_BYTES[kernel][optimizer] * params / device.memory_rate
    return combine(traffic, host_seconds, device.sms is None)


def step_seconds(ctx: CostContext, stepped: tuple[float, float] | None = None) -> float:
    """Clipping and the optimizer step on the busiest rank. ``stepped``: the (parameters, tensors)
    its optimizer steps, where sharding makes them fewer than the rank holds (default: all of them)."""
    overheads = measured_overheads(ctx)
    tensors = tensors_per_rank(ctx)
    params, stepped_tensors = stepped if stepped is not None else (max(st.params for st in ctx.stages), tensors)
    host = (
        step_host_ops(ctx.model, max(st.layers for st in ctx.stages)) * ctx.device.seconds_per_op
        + tensors * overheads.clip_per_tensor
        + stepped_tensors * overheads.optimizer_per_tensor
    )
    return optimizer_step_seconds(params, ctx.plan.train.optimizer, ctx.device, host, ctx.profile.optimizer_kernel)
