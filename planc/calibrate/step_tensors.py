"""What the step's clipping and optimizer cost per parameter tensor.

planc's step clips the gradients (:mod:`planc.runtime.grad_norm`: a ``foreach`` norm, then a
``foreach`` rescale) and steps fused AdamW, one call per parameter group. The cost model counts
those as a few ops per step (:data:`planc.cost.dispatch.STEP_OPS`), as a GPU runs them: a
``foreach`` op launches one kernel per chunk of tensors, and the fused step one. A CPU has no
multi-tensor kernels: ``torch._foreach_norm`` and ``_foreach_mul_`` loop over the tensors in C++,
an op per tensor, and the fused AdamW kernel counts each tensor's step on its own. That is
microseconds per tensor (3.8 for clipping and 4.3 for AdamW on this project's 2-core host, one
process, 40 tensors against 80), which the ops per step did not price: on the CPU matrix's
ZeRO-1 case (39 tensors) clipping took 0.42 ms and the local AdamW step over 20 tensors 0.34 ms,
priced at 0.23 ms together with the rest of the step's ops, and every DDP and ZeRO-1 case ran
slower than predicted (docs/accuracy.md).

Measured on planc's GPT blocks (16 tensors each, the program's shapes), as the slope between
:data:`MORE` blocks and one: the per-step part stays in the ops per step, the per-tensor part is
this. Clipping and the optimizer separately, as ZeRO-1 clips every tensor but steps only its
share. Paired alternating repetitions (:func:`~planc.calibrate.timing.paired_difference`), the
slowest rank's when several measure at once. On a GPU the same measurement reads the host's
per-tensor work of the multi-tensor launches, which the device's queue mostly hides.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from planc.calibrate.timing import paired_difference, slowest_rank
from planc.calibrate.tp_block import SPEC
from planc.spec.model import ModelSpec

#: Blocks of the larger measured set (one is the smaller): 64 tensors against 16.
MORE = 4


def measure_step_tensors(device: torch.device, budget: float) -> tuple[float, float]:
    """(clipping, optimizer) seconds per parameter tensor per step (>= 0): the step over
    :data:`MORE` GPT blocks' tensors less the same over one block's, over the tensors between."""
    few, many = _blocks(1, device), _blocks(MORE, device)
    extra_tensors = len(many) - len(few)
    clip = paired_difference(_clipping(many), _clipping(few), device, budget)
    optimizer = paired_difference(_optimizer(many), _optimizer(few), device, budget)
    return (
        slowest_rank(max(0.0, clip) / extra_tensors, device),
        slowest_rank(max(0.0, optimizer) / extra_tensors, device),
    )


def _blocks(count: int, device: torch.device) -> list[torch.Tensor]:
    """The parameters of ``count`` planc GPT blocks at the calibration's sizes, with gradients."""
    from planc.runtime.transformer import TransformerBlock

    torch.manual_seed(0)
    spec = ModelSpec.model_validate(SPEC)
    params: list[torch.Tensor] = [p for _ in range(count) for p in TransformerBlock(spec).to(device).parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def _clipping(params: list[torch.Tensor]) -> Callable[[], None]:
    from planc.runtime.grad_norm import clip_to_norm, grad_norm

    device = params[0].device

    def clip() -> None:
        # max_norm far above the norm: the factor is 1, the gradients keep their values
        clip_to_norm(params, 1e9, grad_norm(params, 2.0, device=device))

    return clip


def _optimizer(params: list[torch.Tensor]) -> Callable[[], None]:
    """planc's optimizer over ``params``: AdamW in its two groups, fused where the runtime fuses it."""
    from planc.runtime.optim import parameter_groups, runs_fused

    fused = True if runs_fused(params) else None
    optimizer = torch.optim.AdamW(parameter_groups(params, 0.1), lr=1e-9, fused=fused)
    return optimizer.step
