"""Bytes autograd saves for backward, per micro-batch, per transformer block.

``torch.autograd.graph.saved_tensors_hooks`` sees every tensor an op saves for backward. The
pack hook attributes it to the block whose forward is running (forward pre- and post-hooks on
every block of every local model part) or to "outside" (embedding, final norm, head), and
counts each storage once per micro-batch (a new micro-batch starts at each forward of a model
part): views and tensors saved by two ops share memory. Weights are not activations:
parameters, buffers (RoPE tables) and autocast's bf16 copies of parameters are left out.

Limitation: activation checkpointing (``recompute``) installs its own saved-tensor hooks inside
the regions it checkpoints, which take precedence; there the measured bytes are not what the
checkpoint keeps, so :func:`measurable` is False.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from planc.runtime.local_shards import local_shard


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The plain tensor holding ``tensor``'s bytes on this rank: a DTensor's local shard, and inside it
    the buffer of a functional collective still in flight (an ``AsyncCollectiveTensor``, what sequence
    parallelism's redistributions leave, has no storage of its own to ask)."""
    local = local_shard(tensor)
    return getattr(local, "elem", local) if type(local).__name__ == "AsyncCollectiveTensor" else local


def _is_weight_copy(tensor: torch.Tensor) -> bool:
    """autocast's cast of a parameter, or a view of it: a ``_to_copy`` whose input is a leaf that
    accumulates a gradient. A linear saves its weight transposed (``TBackward0`` over the copy),
    so a view is judged by the tensor it views."""
    if tensor._base is not None:
        tensor = tensor._base
    fn = tensor.grad_fn
    if fn is None or type(fn).__name__ != "ToCopyBackward0":
        return False
    return any(n is not None and type(n).__name__ == "AccumulateGrad" for n, _ in fn.next_functions)


def _storages(module: nn.Module) -> set[int]:
    """Addresses of the storages of ``module``'s parameters and buffers as they are now."""
    return {
        _local(t).untyped_storage().data_ptr()
        for t in [*module.parameters(), *module.buffers()]
        if _local(t).untyped_storage().nbytes() > 0
    }


class SavedActivations:
    """Install with ``with counter.step(job): ...`` around one training step; then
    ``counter.micro_batches`` holds one ``{"blocks": [bytes per block...], "outside": bytes}`` per
    micro-batch forward this rank ran."""

    def __init__(self) -> None:
        self.micro_batches: list[dict] = []
        self._block: int | None = None
        self._seen: set[int] = set()
        self._static: set[int] = set()
        self._weights: set[int] = set()
        self._outside_weights: set[int] = set()

    def _begin_micro_batch(self, module, args) -> None:
        self.micro_batches.append({"blocks": defaultdict(float), "outside": 0.0})
        self._seen = set()
        self._outside_weights = self._static | _storages(module)
        self._weights = self._outside_weights

    def _enter_block(self, index: int):
        def hook(module, args):
            # FSDP2 has gathered the block's parameters by now (its pre-forward hook came first):
            # their storages are weights too, and only while this block runs (freed ones get reused)
            self._block = index
            self._weights = self._static | _storages(module)

        return hook

    def _leave_block(self, module, args, output) -> None:
        self._block = None
        self._weights = self._outside_weights

    def _pack(self, tensor: torch.Tensor):
        if self.micro_batches and not isinstance(tensor, nn.Parameter) and not _is_weight_copy(tensor):
            local = _local(tensor)
            storage = local.untyped_storage()
            key = storage.data_ptr()
            if key not in self._weights and key not in self._seen and storage.nbytes() > 0:
                self._seen.add(key)
                record = self.micro_batches[-1]
                if self._block is None:
                    record["outside"] += storage.nbytes()
                else:
                    record["blocks"][self._block] += storage.nbytes()
        return tensor

    def step(self, parts: list[nn.Module]):
        """Context manager measuring one step over the (unwrapped) model ``parts``."""
        import contextlib

        @contextlib.contextmanager
        def measuring():
            handles = []
            self._static = set().union(*(_storages(part) for part in parts))
            self._weights = self._outside_weights = self._static
            index = 0
            for part in parts:
                handles.append(part.register_forward_pre_hook(self._begin_micro_batch))
                for block in getattr(part, "layers", {}).values():
                    handles.append(block.register_forward_pre_hook(self._enter_block(index)))
                    handles.append(block.register_forward_hook(self._leave_block))
                    index += 1
            try:
                with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t):
                    yield self
            finally:
                for handle in handles:
                    handle.remove()

        return measuring()

    def summary(self) -> dict:
        """Bytes of all blocks of one micro-batch, of the largest block and outside the blocks
        (each the largest over the micro-batches)."""
        if not self.micro_batches:
            return {}
        per_mb = [sum(r["blocks"].values()) for r in self.micro_batches]
        per_block = [b for r in self.micro_batches for b in r["blocks"].values()]
        return {
            "micro_batches": len(self.micro_batches),
            "blocks_bytes": max(per_mb),
            "per_block_bytes": max(per_block) if per_block else 0.0,
            "blocks": len(self.micro_batches[-1]["blocks"]),
            "outside_bytes": max(r["outside"] for r in self.micro_batches),
        }


def measurable(job) -> bool:
    """Whether the hook sees what backward keeps (not under activation checkpointing)."""
    return job.layout.recompute == "none"
