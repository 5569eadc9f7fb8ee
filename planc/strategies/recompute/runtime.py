"""Run-time half of ``recompute`` (imports torch): the block wrapper and the selective policy."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from planc.runtime.job import Job

_aten = torch.ops.aten


def _ops(*names: tuple[str, str]) -> set[object]:
    """The op overloads that exist in this torch build (SDPA kernels vary by device and version)."""
    found = set()
    for namespace, name in names:
        packet = getattr(getattr(torch.ops, namespace), name, None)
        if packet is not None:
            found.add(packet.default)
    return found


MATMUL_OPS = _ops(("aten", "mm"), ("aten", "addmm"), ("aten", "bmm"), ("aten", "baddbmm"))

#: Outputs kept in selective mode: the FLOP-heavy ops, and the reducing tensor-parallel
#: collectives (all-reduce, reduce-scatter: rerunning them would repeat a sum). Everything else is
#: recomputed -- including sequence parallelism's all-gathers: their outputs are the full b x s x h
#: inputs of the column-parallel linears, t times the sequence shard they gather. Saving them made
#: selective recomputation with SP keep *more* than without SP (Llama 3 8B, 32 k, TP 8: 47.6 vs
#: 43.6 GiB predicted). Korthikanti et al. 2022 (Sec. 4.2.2, last paragraph) keep only the 1/t
#: shard and all-gather it again in backward, which is what rerunning the all-gather does: two more
#: all-gathers per block in backward (costed by the recompute pass), and SP divides every saved
#: tensor by t (their Table 2). torchtitan's op-level policy saves reduce_scatter, not all-gather.
SAVE_OPS = MATMUL_OPS | _ops(
    ("aten", "_scaled_dot_product_flash_attention"),
    ("aten", "_scaled_dot_product_efficient_attention"),
    ("aten", "_scaled_dot_product_cudnn_attention"),
    ("aten", "_scaled_dot_product_flash_attention_for_cpu"),
    ("aten", "_scaled_dot_product_fused_attention_overrideable"),
    ("_c10d_functional", "all_reduce"),
    ("_c10d_functional", "reduce_scatter_tensor"),
)

#: The block's output projections (row-parallel under TP). Their outputs feed only the residual
#: add, which saves nothing, so without recomputation autograd never keeps them. Saving them
#: would make "selective" keep *more* than no recomputation: under TP they are the unreduced
#: partial sums, a full b x s x h each even with sequence parallelism. They are recomputed
#: instead (the attention-out GEMM reruns in backward; the MLP-down GEMM does not: the
#: recomputation stops early, once the MLP-down input is rebuilt). The collective that follows
#: each of them is still saved, so no communication is repeated.
OUTPUT_PROJECTIONS = ("attention.wo", "feed_forward.w2")


class SelectivePolicy:
    """Save matmul, attention and reducing-collective outputs, except the output projections' matmuls.

    The policy only sees aten ops, not modules: a forward pre-hook on every linear of the block
    says whether the matmuls that follow belong to an output projection (the hooks fire again
    during recomputation). Pre-hooks only -- a recomputation that stops early never runs the
    post-hooks of the module it stopped in.
    """

    def __init__(self) -> None:
        self.in_output_projection = False

    def __call__(self, ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
        if op in MATMUL_OPS and self.in_output_projection:
            return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE

    def entering(self, is_output_projection: bool) -> Callable[[nn.Module, object], None]:
        def hook(module: nn.Module, args: object) -> None:
            self.in_output_projection = is_output_projection

        return hook


def selective_policy_for(block: nn.Module) -> SelectivePolicy:
    """A policy for ``block``, with pre-hooks on its linears."""
    policy = SelectivePolicy()
    for name, module in block.named_modules():
        if isinstance(module, nn.Linear):
            # prepend: mark the module before tensor parallelism's own pre-hook redistributes its input.
            module.register_forward_pre_hook(policy.entering(name in OUTPUT_PROJECTIONS), prepend=True)
    return policy


def wrap_blocks(job: Job, mode: str) -> None:
    """Wrap every transformer block of the job's model parts (in place, names unchanged)."""
    for part in job.transformers():
        for name, block in list(part.layers.items()):
            part.layers[name] = wrap_block(block, mode)


def wrap_block(block: nn.Module, mode: str) -> nn.Module:
    """``block`` under non-reentrant activation checkpointing, full or selective."""
    if mode == "full":
        return checkpoint_wrapper(block, preserve_rng_state=False)
    if mode == "selective":
        policy = selective_policy_for(block)
        return checkpoint_wrapper(
            block, preserve_rng_state=False, context_fn=partial(create_selective_checkpoint_contexts, policy)
        )
    raise ValueError(f"unknown recompute mode {mode!r}; expected 'full' or 'selective'")
