"""The training loss: next-token cross-entropy in float32, computed in chunks of tokens.

The plain way, ``F.cross_entropy(logits.float(), targets)``, holds the whole logits tensor in
float32 twice over: the upcast copy, then log-softmax's output, which autograd keeps for backward,
and backward adds two more float32 tensors of the same size (the gradient of that output and of
its input). For a 50k vocabulary and 26 x 2048 tokens per micro-batch that is ~10 GiB per copy.

:func:`chunked_cross_entropy` cuts the tokens into chunks of at most :data:`CHUNK_ELEMENTS` logits
and runs each chunk's upcast + cross-entropy under non-reentrant activation checkpointing
(``torch.utils.checkpoint``): the forward keeps only the logits themselves (in the dtype the head
produced them), and backward recomputes one chunk's float32 tensors at a time. So the float32
work memory is bounded by one chunk however long the sequence or large the vocabulary, and the
numbers are those of one float32 cross-entropy over all tokens (the chunk sums differ from a
single sum only in summation order). When all the tokens fit in one chunk, it runs as that one
cross-entropy, without checkpointing (which would bound nothing there, and cost a recompute).

It works unchanged on vocabulary-sharded DTensor logits under tensor parallelism's
``loss_parallel()``: splitting along tokens keeps the vocabulary sharding, and each chunk's
cross-entropy is DTensor's own vocabulary-parallel one. (``loss_parallel()`` must be active in
backward too, where the chunks are recomputed; planc's step enters it around both.) Under
pipelining it is the last stage's ``loss_fn``.

The vocabulary padding (``ModelSpec.padded_vocab`` rows beyond ``vocab``, kept for even shards
and aligned GEMMs) takes no probability: those logits are masked to -inf before the softmax, so
the loss is the cross-entropy over the tokenizer's vocabulary -- the objective a Hugging Face
model with ``vocab_size = vocab`` computes, and the padding rows never receive a gradient.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from planc.cost.memory import LOSS_CHUNK_ELEMENTS

#: Logits per chunk (local ones, under vocabulary parallelism): 2**24 float32 values are 64 MiB,
#: and a chunk's backward holds three such tensors (planc.cost.memory.logits_bytes, which defines
#: the constant so the cost model and the runtime cannot disagree). Large enough that each chunk
#: is a big kernel on a GPU (333 tokens of a 50k vocabulary), small enough that the float32 work
#: is about 200 MiB, never gigabytes.
CHUNK_ELEMENTS = LOSS_CHUNK_ELEMENTS


def tokens_per_chunk(local_vocab: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    """Tokens in one loss chunk: as many as fit ``chunk_elements`` local logits (at least 1)."""
    return max(1, chunk_elements // local_vocab)


def chunked_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab: int | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Mean float32 cross-entropy of ``logits`` ``[..., padded_vocab]`` against ``targets`` ``[...]``.

    ``vocab``: the real vocabulary size; logits of the padding columns ``vocab..padded_vocab-1``
    are left out of the softmax (None or equal to the width: nothing is masked).
    """
    flat_logits = logits.flatten(0, -2)
    flat_targets = targets.flatten()
    count = flat_targets.numel()
    padded = flat_logits.shape[-1]
    mask = _padding_mask(flat_logits, vocab) if vocab is not None and vocab < padded else None
    local_vocab = _local_width(flat_logits)
    step = tokens_per_chunk(local_vocab, chunk_elements)
    if step >= count:
        # One chunk holds every token: checkpointing it would bound nothing (its float32 tensors
        # are the whole loss's either way) and would keep the logits and recompute the chunk in
        # backward; without it the peak is the plain loss's 12 bytes per logit, below the chunked
        # bound (planc.cost.memory.logits_bytes), and the step runs one forward of the loss.
        return _chunk_loss_sum(flat_logits, flat_targets, mask) / count
    total: torch.Tensor | None = None
    # split, not slicing: one SplitBackward concatenates the chunks' gradients once, where each
    # slice's backward would write its chunk into a zero tensor of the full size
    for chunk, chunk_targets in zip(flat_logits.split(step), flat_targets.split(step)):
        part: torch.Tensor = checkpoint(_chunk_loss_sum, chunk, chunk_targets, mask, use_reentrant=False)
        total = part if total is None else total + part
    if total is None:
        raise ValueError("cross-entropy of no tokens")
    return total / count


def _chunk_loss_sum(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Summed float32 cross-entropy of one chunk (run under checkpoint: its float32 tensors are not kept)."""
    upcast = logits.float()
    if mask is not None:
        upcast = upcast + mask
    return F.cross_entropy(upcast, targets, reduction="sum")


def _local_width(logits: torch.Tensor) -> int:
    """Columns of ``logits`` this rank holds (a DTensor sharded over the vocabulary holds a slice)."""
    local = logits.to_local() if hasattr(logits, "to_local") else logits
    return max(1, local.shape[-1])


def _padding_mask(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """0 for the ``vocab`` real columns, -inf for the padding: added to the float32 logits.

    For DTensor logits the mask is a DTensor laid out like their last dimension (sharded where
    they are sharded over the vocabulary, replicated elsewhere), cut locally with no communication.
    """
    width = logits.shape[-1]
    mask = torch.zeros(width, dtype=torch.float32, device=_device(logits))
    mask[vocab:] = -math.inf
    if not hasattr(logits, "device_mesh"):
        return mask
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    assert isinstance(logits, DTensor)
    last = logits.ndim - 1
    placements = [Shard(0) if isinstance(p, Shard) and p.dim in (last, -1) else Replicate() for p in logits.placements]
    return distribute_tensor(mask, logits.device_mesh, placements, src_data_rank=None)


def _device(logits: torch.Tensor) -> torch.device:
    return logits.to_local().device if hasattr(logits, "to_local") else logits.device
