"""``fsdp``: ZeRO stages 2 and 3 with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Each transformer block, and then the root of each model part, is ``fully_shard``-ed over the
"dp" mesh dimension: parameters, gradients and optimizer state are sharded 1/dp per rank
(parameters as DTensors; with tensor parallelism, 2-D DTensors over ("dp", "tp")).

* ZeRO-3 (``reshard_after_forward=True``): parameters are freed after each block's forward and
  all-gathered again for backward (Rajbhandari et al. 2020, §5.2, P_os+g+p).
* ZeRO-2 (``reshard_after_forward=False``): the unsharded parameters stay from forward to
  backward; gradients are reduce-scattered and optimizer state is sharded (P_os+g).

Gradient accumulation keeps ZeRO's promise by default: every micro-batch's backward
reduce-scatters its gradients into the sharded ``.grad`` (1/dp of the fp32 gradients per rank),
as torchtitan does. ``use fsdp { accumulate_unsharded = true }`` instead turns reduction off
(``set_requires_gradient_sync(False)``) for all micro-batches but the last: one reduce-scatter per
step, but FSDP2 then keeps the stage's *unsharded* fp32 gradients between micro-batches (4 bytes
per parameter). Under pipelining torch's ``PipelineStage`` always does the latter itself. With
``bf16`` active, FSDP2 takes its ``MixedPrecisionPolicy``
(bf16 compute copies, fp32 sharded master weights, fp32 gradient reduce-scatter) -- which is why
``bf16`` is applied before ``fsdp``: FSDP2 takes the policy only when it wraps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planc.spec.fields import Flag
from planc.strategies.api import StrategyOptions
from planc.strategies.composition import after
from planc.strategies.fsdp.cost_pass import cost as cost  # the plan-time cost pass (a contract hook)

if TYPE_CHECKING:
    from planc.runtime.job import Job
    from planc.spec.layout import Layout
    from planc.spec.plan import Plan

NAME = "fsdp"
API_VERSION = 1
DESCRIPTION = "ZeRO-2/3: FSDP2 fully_shard per block; sharded params, grads and optimizer state"
AFTER: tuple[str, ...] = after(NAME)


class Options(StrategyOptions):
    """Options of ``use fsdp { ... }``."""

    FROM_LAYOUT = {"reshard_after_forward": lambda layout: layout.zero == 3}

    reshard_after_forward: Flag | None = None
    """Free gathered parameters after forward (ZeRO-3) or keep them until backward (ZeRO-2);
    default: from the layout's zero stage (3 -> true, 2 -> false)."""
    accumulate_unsharded: Flag = False
    """With gradient accumulation, reduce-scatter once per step and keep unsharded fp32 gradients
    between micro-batches (less traffic, 4 bytes per parameter more memory). Default: reduce-scatter
    every micro-batch, gradients stay sharded."""


def enabled(plan: Plan, layout: Layout) -> bool:
    """ZeRO stage 2 or 3."""
    return layout.zero in (2, 3)


def check(plan: Plan, layout: Layout, options: Options) -> str | None:
    expected = layout.zero == 3
    if options.reshard_after_forward is not None and options.reshard_after_forward != expected:
        return (
            f"reshard_after_forward = {str(options.reshard_after_forward).lower()} contradicts "
            f"layout zero = {layout.zero} (ZeRO-3 reshards, ZeRO-2 does not); set the zero stage instead"
        )
    return None


def reshards(layout: Layout, options: Options) -> bool:
    """Whether parameters are freed after forward: the option when given, else ZeRO-3."""
    return options.reshard_after_forward if options.reshard_after_forward is not None else layout.zero == 3


def apply(job: Job, options: Options) -> None:
    """``fully_shard`` every block, then each model part's root, over the "dp" mesh dimension."""
    from planc.strategies.fsdp.runtime import shard_model_parts

    shard_model_parts(job, reshard=reshards(job.layout, options), accumulate_unsharded=options.accumulate_unsharded)
