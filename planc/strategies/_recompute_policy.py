"""Run-time half of ``recompute`` (imports torch): the block wrapper and the selective policy."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_aten = torch.ops.aten


def _ops(*names: tuple) -> set:
    """The op overloads that exist in this torch build (SDPA kernels vary by device and version)."""
    found = set()
    for namespace, name in names:
        packet = getattr(getattr(torch.ops, namespace), name, None)
        if packet is not None:
            found.add(packet.default)
    return found


#: Outputs kept in selective mode: the FLOP-heavy ops, and the tensor-parallel collectives (so
#: recomputation never repeats communication). Everything else is recomputed.
SAVE_OPS = _ops(
    ("aten", "mm"), ("aten", "addmm"), ("aten", "bmm"), ("aten", "baddbmm"),
    ("aten", "_scaled_dot_product_flash_attention"),
    ("aten", "_scaled_dot_product_efficient_attention"),
    ("aten", "_scaled_dot_product_cudnn_attention"),
    ("aten", "_scaled_dot_product_flash_attention_for_cpu"),
    ("aten", "_scaled_dot_product_fused_attention_overrideable"),
    ("_c10d_functional", "all_reduce"),
    ("_c10d_functional", "reduce_scatter_tensor"),
    ("_c10d_functional", "all_gather_into_tensor"),
)


def selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Save matmul, attention and collective outputs; recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def wrap_block(block: nn.Module, mode: str) -> nn.Module:
    """``block`` under non-reentrant activation checkpointing, full or selective."""
    if mode == "full":
        return checkpoint_wrapper(block, preserve_rng_state=False)
    if mode == "selective":
        return checkpoint_wrapper(block, preserve_rng_state=False,
                                  context_fn=partial(create_selective_checkpoint_contexts, selective_policy))
    raise ValueError(f"unknown recompute mode {mode!r}; expected 'full' or 'selective'")
