"""What a CUDA kernel would keep for backward, on a simulation's CPU fake tensors.

``planc verify --simulate`` runs the program on fake tensors of the ``cpu`` device (this torch
build has no CUDA), so torch dispatches each op as it would on CPU. For memory that matters only
where the CPU and CUDA paths of one op save different tensors for backward, and in planc's
model one op does: RMSNorm.

- On CUDA, ``torch.rms_norm`` runs ``aten._fused_rms_norm``, whose autograd saves the input and
  the per-row ``rstd`` (float32, one value per row) -- as ``native_layer_norm`` does.
- On CPU, ``_fused_rms_norm`` has no kernel and decomposes before autograd
  (``torch/_decomp/decompositions.py``, ``_fused_rms_norm``): ``x.float()``, ``pow``, ``mean``,
  ``rsqrt``, ``mul``, ``type_as``, ``mul``, each saving its inputs. For a bf16 input that keeps
  two float32 copies of the norm's input where CUDA keeps the bf16 input itself: 3 x 2 bytes per
  element more per norm, 0.40 GB per block for Llama 3 8B at 8192 tokens with no recomputation
  (measured under fake tensors), the -15% of issue 13's first simulation table.

The cost model knows both (``RuntimeProfile.rms_norm``: ``fused`` for CUDA, ``composite`` for CPU,
planc/cost/memory.py); the simulation checks the GPU prediction, so :func:`cuda_rms_norm` makes
RMSNorm keep what the CUDA kernel keeps. The values it computes are the composite's (fake
tensors hold none anyway); only what stays alive for backward changes.

The optimizer step: planc builds torch's fused AdamW on CUDA and, since 2026-11-29, on CPU
(:func:`planc.runtime.optim.runs_fused`); torch's single-tensor loop, which CPU runs took before,
holds two temporaries the size of the parameter it updates (``exp_avg_sq.sqrt()`` and its
quotient): 3.9 GiB for Llama 3 8B's embedding, the simulated peak of a step of one micro-batch
under full recomputation. :func:`cuda_optimizers` makes sure the simulation's optimizers take the
fused kernel whatever device its fake tensors report.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn


class _RmsNormSavingInputAndRstd(torch.autograd.Function):
    """RMSNorm whose backward keeps what ``aten._fused_rms_norm``'s does: the input, the weight and
    the float32 ``rstd`` per row. Backward recomputes the norm from the input to differentiate it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, shape: tuple[int, ...], weight: torch.Tensor | None, eps: float | None):
        eps = torch.finfo(torch.float32).eps if eps is None else eps
        out, rstd = _composite(x, len(shape), weight, eps)
        ctx.dims, ctx.eps = len(shape), eps
        ctx.save_for_backward(x, weight, rstd)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight, _ = ctx.saved_tensors
        with torch.enable_grad():
            x_ = x.detach().requires_grad_(True)
            w_ = weight.detach().requires_grad_(True) if weight is not None else None
            out, _ = _composite(x_, ctx.dims, w_, ctx.eps)
            inputs = (x_,) if w_ is None else (x_, w_)
            grads = torch.autograd.grad(out, inputs, grad)
        return grads[0], None, grads[1] if w_ is not None else None, None


def _composite(x: torch.Tensor, dims: int, weight: torch.Tensor | None, eps: float):
    """The decomposition of ``_fused_rms_norm`` (output in the input's dtype, and ``rstd``), written
    with plain ops so that no RMSNorm call is routed back here."""
    upcast = x.float() if x.dtype in (torch.bfloat16, torch.float16) else x  # as torch's computation dtype
    rstd = torch.rsqrt(upcast.pow(2).mean(dim=tuple(range(-dims, 0)), keepdim=True) + eps)
    out = upcast * rstd
    if weight is not None:
        out = out * weight
    return out.type_as(x), rstd


@contextlib.contextmanager
def cuda_rms_norm(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Inside, every ``nn.RMSNorm`` in ``modules`` keeps for backward what torch's CUDA kernel keeps
    (see the module docstring). Set on the module instances, not through a torch function mode,
    so that activation checkpointing's recomputation in backward -- which runs outside any mode
    entered around the step -- makes the same call and saves the same tensors."""
    norms = [m for root in modules for m in root.modules() if isinstance(m, nn.RMSNorm)]
    for norm in norms:
        norm.forward = functools.partial(_forward, norm)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for norm in norms:
            del norm.forward


def _forward(norm: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    if not torch.is_grad_enabled():
        return F.rms_norm(x, norm.normalized_shape, norm.weight, norm.eps)
    return _RmsNormSavingInputAndRstd.apply(x, tuple(norm.normalized_shape), norm.weight, norm.eps)


def cuda_optimizers(optimizers: Iterable[torch.optim.Optimizer]) -> None:
    """Make each optimizer step with torch's fused kernel, as planc's program does on CUDA (its
    parameter groups carry the choice; ZeroRedundancyOptimizer's local optimizer is ``.optim``)."""
    for optimizer in optimizers:
        local = getattr(optimizer, "optim", optimizer)
        for group in local.param_groups:
            if "fused" in group:
                group["fused"], group["foreach"] = True, False
