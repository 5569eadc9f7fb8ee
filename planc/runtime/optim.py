"""Optimizer, learning-rate schedule and gradient clipping, correct for sharded and staged models.

* :func:`build_optimizer` -- AdamW / Adam / SGD from a :class:`~planc.spec.TrainSpec`.
* :func:`build_lr_scheduler` -- linear warmup, then cosine decay to ``min_lr`` (a ``LambdaLR``).
* :func:`clip_grad_norm_` -- the global gradient norm over all ranks' shards (DTensor TP/FSDP) and all
  pipeline stages, and the rescale (:mod:`planc.runtime.grad_norm`). Returns the total norm.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import cast

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR

from planc.runtime.grad_norm import clip_to_norm, grad_norm
from planc.spec import TrainSpec

#: Adam's epsilon (PyTorch's default; GPT-3 and Llama use 1e-8 too).
ADAM_EPS = 1e-8


def parameter_groups(params: Iterable[torch.Tensor], weight_decay: float) -> list[dict]:
    """Two groups: matrices and embeddings (>= 2-D) are decayed; biases and norm gains (1-D) are not.

    Decay pulls a weight towards 0. For a matrix that is regularisation; for a LayerNorm/RMSNorm gain
    it would pull the normalised activations towards 0 and for a bias towards a fixed offset, neither
    of which is a "smaller model" (GPT-3 and nanoGPT exclude them the same way; Loshchilov & Hutter 2019
    decay weights only). The rule depends only on each parameter's full (global) shape, so a DTensor
    shard lands in the same group as the unsharded parameter.

    Parameters that are DTensors and plain tensors are put in separate groups: ``foreach`` optimizer
    kernels cannot mix them in one list (tensor parallelism without sequence parallelism leaves the
    norms as plain tensors).
    """
    from torch.distributed.tensor import DTensor

    groups: dict[tuple[bool, bool], list[torch.Tensor]] = {}
    for p in params:
        if not p.requires_grad:
            continue
        groups.setdefault((p.ndim >= 2, isinstance(p, DTensor)), []).append(p)
    return [
        {"params": ps, "weight_decay": weight_decay if decay else 0.0}
        for (decay, _), ps in sorted(groups.items(), key=lambda kv: (not kv[0][0], kv[0][1]))
    ]


#: Devices on which planc's optimizers take torch's fused kernel (torch has fused Adam, AdamW and
#: SGD for both since 2.4; a mix of the two is refused by the kernel).
FUSED_DEVICES = frozenset({"cuda", "cpu"})


def runs_fused(params: list[torch.Tensor]) -> bool:
    """Whether the optimizer takes torch's fused kernel: every parameter on the same kind of device,
    CUDA or CPU (DTensor shards report their local device). Fused Adam/AdamW reads and writes each
    state once per step, in one call per parameter group:

    - on CUDA, torch's default, the multi-tensor ``foreach`` path, makes nine passes with
      temporaries -- 65 ms measured for 1.92 B parameters on an H100, where the fused kernel's bytes
      come to about 26 ms (docs/gpu.md, where planc's fused step later ran on an H100 as fast as a
      hand-written loop's). torchtitan's default is fused too;
    - on CPU torch's default is a Python loop of ~9 ops per tensor, and over DTensor parameters
      (FSDP2, ``replicate``, TP) each of those ops goes through DTensor's dispatch: AdamW over 69
      tensors of the CPU matrix's GPT on 2 gloo ranks took 3.4 ms over plain tensors and 20 ms
      over FSDP2's DTensors; fused, 0.4 and 1.7 ms (docs/accuracy.md)."""
    kinds = {p.device.type for p in params}
    return len(kinds) == 1 and kinds <= FUSED_DEVICES


def build_optimizer(params: Iterable[torch.Tensor], train: TrainSpec) -> torch.optim.Optimizer:
    """The optimizer the plan names: adamw (decoupled decay), adam (L2 decay), sgd (momentum = beta1),
    with torch's fused kernel when every parameter is on one CUDA or CPU device (:func:`runs_fused`)."""
    params = list(params)
    groups = parameter_groups(params, train.weight_decay)
    if not groups:
        raise ValueError("build_optimizer: no trainable parameters")
    fused = True if runs_fused(params) else None  # None: torch's default for a device fused does not run on
    if train.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=train.lr, betas=(train.beta1, train.beta2), eps=ADAM_EPS, fused=fused)
    if train.optimizer == "adam":
        return torch.optim.Adam(groups, lr=train.lr, betas=(train.beta1, train.beta2), eps=ADAM_EPS, fused=fused)
    if train.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=train.lr, momentum=train.beta1, fused=fused)
    raise ValueError(f"unknown optimizer {train.optimizer!r}; choose adamw, adam or sgd")


def lr_at(step: int, train: TrainSpec) -> float:
    """Learning rate of optimizer step ``step`` (0-based): linear warmup, then cosine to ``min_lr``.

    Warmup: lr * (step + 1) / warmup_steps for step < warmup_steps, so step warmup_steps - 1 uses the
    full lr. Then cosine annealing (Loshchilov & Hutter 2017, SGDR Eq. 5, one cycle):
    min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2 with t = (step - warmup) / (steps - warmup),
    clamped to [0, 1] so training past ``steps`` stays at min_lr.
    """
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    decay_steps = max(1, train.steps - train.warmup_steps)
    t = min(1.0, (step - train.warmup_steps) / decay_steps)
    return train.min_lr + (train.lr - train.min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))


def build_lr_scheduler(optimizer: torch.optim.Optimizer, train: TrainSpec) -> LambdaLR:
    """A ``LambdaLR`` following :func:`lr_at`; call ``scheduler.step()`` after each ``optimizer.step()``."""
    return LambdaLR(optimizer, lambda step: lr_at(step, train) / train.lr)


@torch.no_grad()
def clip_grad_norm_(
    parameters: Iterable[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    pp_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Scale all gradients so their global norm is at most ``max_norm``; returns the norm before clipping.

    ``pp_group``: the pipeline-parallel process group (or a 1-D DeviceMesh) when the model is split
    over stages, so every stage clips by the same, global norm. ``max_norm <= 0`` only measures.
    """
    parameters = list(parameters)
    if pp_group is not None and hasattr(pp_group, "get_group"):
        pp_group = pp_group.get_group()
    total = grad_norm(parameters, norm_type, pp_group)
    if max_norm > 0:
        clip_to_norm(parameters, max_norm, total)
    return total


@torch.no_grad()
def reduce_partial_gradients(parameters: Iterable[torch.nn.Parameter]) -> int:
    """Sum once, over their mesh, the gradients that backward left as pending sums; returns how many.

    Under sequence parallelism a replicated parameter used on a sequence shard (the norms' gains and
    biases) gets a ``Partial`` gradient: each tensor-parallel rank holds its own shard's share.
    Left so, every op that reads it pays an all-reduce of its own -- DTensor redistributes a
    ``Partial`` argument per op and keeps none of the results -- so AdamW's step all-reduced each
    such gradient about three times, and the norm once more (on 2 gloo ranks, a 4-layer GPT block
    stack: AdamW 52 ms per step against 13 ms without sequence parallelism). Megatron-LM sums its
    layernorm gradients over the tensor-parallel group once per step, coalesced; so does this: one
    all-reduce per mesh dimension holding partial sums, over all such gradients flattened into one
    buffer, and each gradient becomes the DTensor of its parameter's placements.
    """
    from torch.distributed.tensor import DTensor, Partial

    groups: dict[tuple, list] = {}
    for param in parameters:
        grad = param.grad
        if isinstance(grad, DTensor) and any(isinstance(p, Partial) for p in grad.placements):
            key = (grad.device_mesh, tuple(grad.placements), tuple(cast(DTensor, param).placements))
            groups.setdefault(key, []).append(param)
    for (mesh, placements, target), params in groups.items():
        partial_dims = [i for i, p in enumerate(placements) if isinstance(p, Partial)]
        if any(placements[i].reduce_op != "sum" for i in partial_dims):
            for param in params:  # another reduction: DTensor's own, tensor by tensor
                param.grad = param.grad.redistribute(mesh, target)
            continue
        locals_ = [param.grad.to_local() for param in params]
        sum_in_place(locals_, [mesh.get_group(dim) for dim in partial_dims])
        resolved = tuple(target[i] if i in partial_dims else p for i, p in enumerate(placements))
        for param, local in zip(params, locals_):
            param.grad = DTensor.from_local(local, mesh, resolved, run_check=False)
    return sum(len(params) for params in groups.values())


@torch.no_grad()
def sum_in_place(tensors: list[torch.Tensor], groups: Iterable[dist.ProcessGroup]) -> None:
    """Sum ``tensors`` over each of ``groups`` in turn, all of them in one flat buffer (one
    all-reduce per group, not per tensor), written back in place: DDP's gradients are views into
    its buckets and must stay so."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    for group in groups:
        dist.all_reduce(flat, group=group)
    for tensor, summed in zip(tensors, flat.split([t.numel() for t in tensors])):
        tensor.copy_(summed.view_as(tensor))
