"""The global gradient norm and its clipping, worked on each rank's local shards.

A sharded gradient is a DTensor (FSDP2, tensor parallelism) or, where planc keeps a
tensor-parallel shard as a plain tensor for DDP, a plain tensor with the DTensor spec it stands
for. Its norm could be taken through DTensor (``torch.nn.utils.get_total_norm`` on the DTensors,
then ``full_tensor()``, as torchtitan does), but then every per-tensor op goes through DTensor's
dispatch, and the rescale by a plain coefficient converts it for each gradient. On 2 gloo ranks
and the 4-block model of bench/overhead.py, that cost 2.9 ms per step under FSDP2 and 5.3 ms
under tensor parallelism, against 1.3 and 2.1 ms for the same arithmetic on the local tensors
(``python bench/clip_speed.py``; torch's own ``clip_grad_norm_`` took 2.8 and 4.4 ms). So the
arithmetic is done here on the local shards, with the reductions DTensor would do:

* for each kind of gradient (mesh and placements), this rank's sum of ``|g|^p`` over its shards
  (``torch._foreach_norm``, then powers in float32), all-reduced over every mesh dimension the
  kind is sharded on (``Shard``, and FSDP2's ``_StridedShard``) -- one all-reduce per dimension,
  as ``full_tensor()`` turns a ``Partial`` norm into a replicated one -- and not over a
  ``Replicate`` dimension, whose ranks hold the same values;
* the kinds' sums are added, and with pipeline stages summed over the pipeline group (Megatron-LM
  sums its norm over the model-parallel group the same way);
* the rescale multiplies the local shards in place (a DTensor's values are its local tensor).

A gradient still ``Partial`` (a pending sum; planc's step resolves those first:
``reduce_partial_gradients``) is left to DTensor, which knows how to reduce it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from planc.runtime.local_shards import local_shard


def _kind(holder: Any) -> tuple[Any, tuple] | None:
    """(mesh, placements) of a holder's gradient: its own spec (a plain shard standing for a
    DTensor), its DTensor's, or None for a plain, unsharded gradient."""
    spec = getattr(holder, "spec", None)
    if spec is not None:
        return spec.mesh, tuple(spec.placements)
    grad = holder.grad
    if hasattr(grad, "device_mesh") and hasattr(grad, "placements"):
        return grad.device_mesh, tuple(grad.placements)
    return None


def _powered_sum(tensors: Sequence[torch.Tensor], norm_type: float) -> torch.Tensor:
    """sum |t|^p over all ``tensors`` (max |t| for p = inf), in float32. One foreach norm per
    dtype: each norm comes back in its tensor's dtype, and a stack takes one."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    norms = torch.cat([torch.stack(torch._foreach_norm(group, norm_type)).float() for group in by_dtype.values()])
    if math.isinf(norm_type):
        return norms.max()
    return norms.pow(norm_type).sum()


@torch.no_grad()
def grad_norm(
    holders: Iterable[Any],
    norm_type: float = 2.0,
    pp_group: dist.ProcessGroup | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The norm of all gradients as one vector, over every shard and every pipeline stage.

    ``holders``: parameters, or views with a ``.grad`` (and an optional ``.spec``, the DTensor spec
    of a plain shard). Returns a plain 0-dim float32 tensor, the same on every rank. ``device``:
    where a rank that holds no gradient makes its zero, which it still all-reduces with the other
    stages (NCCL takes only tensors on the rank's own GPU).
    """
    reduce_op = dist.ReduceOp.MAX if math.isinf(norm_type) else dist.ReduceOp.SUM
    by_kind: dict[Any, list] = {}
    for holder in holders:
        if holder.grad is not None:
            by_kind.setdefault(_kind(holder), []).append(holder)
    parts = []
    for kind, group in by_kind.items():
        if kind is not None and any(p.is_partial() for p in kind[1]):
            norm: Any = torch.nn.utils.get_total_norm([holder.grad for holder in group], norm_type)
            parts.append(_powered(norm.full_tensor().float(), norm_type))
            continue
        powered = _powered_sum([local_shard(holder.grad) for holder in group], norm_type)
        if kind is not None:
            mesh, placements = kind
            for dim, placement in enumerate(placements):
                # any sharding: ``Shard``, and FSDP2's ``_StridedShard`` over a tensor-parallel shard,
                # which is no ``Shard`` to ``is_shard()``; each rank's piece is part of the whole
                if not placement.is_replicate() and mesh.size(dim) > 1:
                    dist.all_reduce(powered, op=reduce_op, group=mesh.get_group(dim))
        parts.append(powered)
    if not parts:
        total = torch.zeros((), device=device)
    else:
        total = torch.stack(parts).max() if math.isinf(norm_type) else torch.stack(parts).sum()
    if pp_group is not None:
        dist.all_reduce(total, op=reduce_op, group=pp_group)
    return total if math.isinf(norm_type) else total ** (1.0 / norm_type)


def _powered(norm: torch.Tensor, norm_type: float) -> torch.Tensor:
    return norm if math.isinf(norm_type) else norm**norm_type


@torch.no_grad()
def clip_to_norm(holders: Iterable[Any], max_norm: float, total_norm: torch.Tensor) -> None:
    """Scale every gradient by ``min(1, max_norm / (total_norm + 1e-6))``, in place on its local
    shard (torch's ``clip_grads_with_norm_`` rule: multiplied even when the factor is 1, so that
    no value is read on the host)."""
    coefficient = torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
    lists: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for holder in holders:
        if holder.grad is not None:
            local = local_shard(holder.grad)
            lists.setdefault((local.device, local.dtype), []).append(local)
    for (where, _), tensors in lists.items():
        torch._foreach_mul_(tensors, coefficient.to(where))
