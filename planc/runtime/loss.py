"""The training loss: next-token cross-entropy in float32, computed in chunks of tokens.

The plain way, ``F.cross_entropy(logits.float(), targets)``, holds the whole logits tensor in
float32 twice over: the upcast copy, then log-softmax's output, which autograd keeps for backward,
and backward adds two more float32 tensors of the same size (the gradient of that output and of
its input). For a 50k vocabulary and 26 x 2048 tokens per micro-batch that is ~10 GiB per copy.

:func:`chunked_cross_entropy` cuts the tokens into chunks of at most :data:`CHUNK_ELEMENTS` logits,
so the float32 work memory is bounded by one chunk however long the sequence or large the
vocabulary. Each chunk's float32 tensors live only while that chunk is worked on, in one of two ways:

- ``backward="in_forward"`` (the default): the forward runs each chunk's upcast, cross-entropy and
  its backward at once, and keeps only the chunk's gradient (in the logits' dtype) for the real
  backward, which scales it by the incoming gradient. The loss is read once -- as fused
  cross-entropy kernels do (Liger Kernel's, and flash-attn's Triton one), in plain torch ops. On
  plain logits the gradient is worked out by hand into one buffer (:class:`_LossWithGradient`):
  with ``overwrite_logits=True`` (planc's training step, which never reads the logits again)
  that buffer is the logits' own storage, each chunk's gradient written over the chunk once its
  float32 copy is taken, as Liger Kernel's fused cross-entropy does; the logits and their
  gradient then never exist side by side. On vocabulary-sharded DTensor logits autograd
  differentiates each chunk in the forward (:class:`_ChunkLossWithGradient`), and the split
  concatenates the chunks' gradients.
- ``backward="recompute"``: each chunk runs under non-reentrant activation checkpointing
  (``torch.utils.checkpoint``): the forward keeps only the logits, and backward recomputes one
  chunk's float32 tensors at a time -- the upcast and softmax run twice. The last stage of a GPipe
  or zero-bubble pipeline uses this for DTensor logits: ``PipelineStage`` keeps each micro-batch's
  logits until its backward anyway, and those schedules hold several micro-batches there, so
  gradients kept beside each would double what they hold (``planc.cost.memory.loss_kind``; 1F1B
  holds one). Plain logits there have their gradient written over them instead.

Both keep as many bytes from forward to backward as the logits (their gradient, or themselves);
the numbers are those of one float32 cross-entropy over all tokens (the chunk sums differ from a
single sum only in summation order; the scaled gradient by one rounding). When all the tokens fit
in one chunk, it runs as that one cross-entropy, neither way (which would bound nothing there).
Without gradients (validation) the chunks are only summed.

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
from functools import partial
from typing import TYPE_CHECKING, Literal, TypeGuard

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from planc.cost.memory import LOSS_CHUNK_ELEMENTS

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

#: Logits per chunk (local ones, under vocabulary parallelism): 2**26 float32 values are 256 MiB;
#: a chunk's float32 work is two such tensors (a gradient worked out in the forward) or three
#: (autograd's, recomputed or under DTensor) -- planc.cost.memory.logits_bytes, which defines the
#: constant so the cost model and the runtime cannot disagree. Small enough that the float32 work
#: stays under a gigabyte; large enough that each chunk's kernels fill a GPU: the softmax kernels
#: give each token's row to one thread block, and at 2**24 (130 tokens of Llama 3's 128 K
#: vocabulary, one block per SM of an H100) the loss ran 9% slower than one whole-tensor
#: cross-entropy, the recomputed one 3.1x; at 2**26 (523 tokens) 3% and 1.6x
#: (bench/loss_speed.py, docs/gpu.md).
CHUNK_ELEMENTS = LOSS_CHUNK_ELEMENTS


def tokens_per_chunk(local_vocab: int, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    """Tokens in one loss chunk: as many as fit ``chunk_elements`` local logits (at least 1)."""
    return max(1, chunk_elements // local_vocab)


#: How a chunk's gradient reaches backward (see the module docstring).
Backward = Literal["in_forward", "recompute"]


def chunked_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab: int | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
    backward: Backward = "in_forward",
    overwrite_logits: bool = False,
) -> torch.Tensor:
    """Mean float32 cross-entropy of ``logits`` ``[..., padded_vocab]`` against ``targets`` ``[...]``.

    ``vocab``: the real vocabulary size; logits of the padding columns ``vocab..padded_vocab-1``
    are left out of the softmax (None or equal to the width: nothing is masked). ``backward``:
    compute each chunk's gradient in the forward, or recompute the chunk in backward.
    ``overwrite_logits``: with the gradient computed in the forward on plain logits that some
    operation produced (not a leaf), write it over the logits instead of beside them -- the caller
    must not read the logits afterwards; any autograd node that saved them raises in backward.
    """
    flat_logits = logits.flatten(0, -2)
    flat_targets = targets.flatten()
    count = flat_targets.numel()
    padded = flat_logits.shape[-1]
    mask = _padding_mask(flat_logits, vocab) if vocab is not None and vocab < padded else None
    local_vocab = _local_width(flat_logits)
    step = tokens_per_chunk(local_vocab, chunk_elements)
    if step >= count:
        # One chunk holds every token: neither way would bound anything (its float32 tensors are
        # the whole loss's either way); as the plain loss the peak is 12 bytes per logit, below
        # the chunked bound (planc.cost.memory.logits_bytes), and the loss is read once.
        return _chunk_loss_sum(flat_logits, flat_targets, mask) / count
    if not (torch.is_grad_enabled() and flat_logits.requires_grad):
        run = _chunk_loss_sum
    elif backward == "in_forward" and not _is_dtensor(flat_logits):
        overwrite = overwrite_logits and _produced(logits)
        return _LossWithGradient.apply(flat_logits, flat_targets, mask, step, overwrite)
    elif backward == "in_forward":
        run = _ChunkLossWithGradient.apply
    else:
        run = partial(checkpoint, _chunk_loss_sum, use_reentrant=False)
    total: torch.Tensor | None = None
    # split, not slicing: one SplitBackward concatenates the chunks' gradients once, where each
    # slice's backward would write its chunk into a zero tensor of the full size
    for chunk, chunk_targets in zip(flat_logits.split(step), flat_targets.split(step)):
        part: torch.Tensor = run(chunk, chunk_targets, mask)
        total = part if total is None else total + part
    if total is None:
        raise ValueError("cross-entropy of no tokens")
    return total / count


class _LossWithGradient(torch.autograd.Function):
    """The mean cross-entropy of plain (not DTensor) logits, its gradient written chunk by chunk
    into one buffer in the forward; backward scales that buffer in place.

    Per chunk, with the gradient worked out by hand rather than by autograd: the float32 copy of
    the chunk (plus the padding mask), its log-softmax (the loss picks the targets' entries), whose
    exponential, in place, is the softmax, minus one at each target: d loss / d logits. The copy
    into the buffer casts it to the logits' dtype. That is 28 bytes of traffic per bf16 logit
    forward and 4 backward, where ``F.cross_entropy`` on the float32 logits moves about 36 and
    autograd per chunk 44 (its backward's zero-filled gradient, the cast back, and the split's
    concatenation); the float32 work is 8 bytes per logit of one chunk. Measured on one H100 by
    bench/loss_speed.py (docs/gpu.md).

    The gradient is kept in the logits' dtype before it is scaled: bf16 has float32's exponent
    range, so small probabilities do not underflow there (fp16, which planc does not offer, would
    lose them before a loss scaler's factor arrives: it would need the buffer in float32).

    ``overwrite``: the buffer is the logits' storage (a detached alias): each chunk is read into its
    float32 copy before its gradient is written back over it. Nothing in planc's graph saves the
    logits (the output head's GEMM keeps its input and weight), and the shared version counter
    makes any node that did raise in backward rather than use the overwritten values.
    """

    @staticmethod
    def forward(
        ctx, logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None, step: int, overwrite: bool
    ) -> torch.Tensor:
        gradient = logits.detach() if overwrite else torch.empty_like(logits)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        for start in range(0, targets.numel(), step):
            chunk, chunk_targets = logits[start : start + step], targets[start : start + step, None]
            work = chunk.to(torch.float32, copy=True)
            if mask is not None:
                work.add_(mask)
            log_probs = torch.log_softmax(work, dim=-1)
            del work
            total -= log_probs.gather(-1, chunk_targets).sum()
            probabilities = log_probs.exp_()
            probabilities.scatter_add_(-1, chunk_targets, torch.full_like(chunk_targets, -1.0, dtype=torch.float32))
            gradient[start : start + step].copy_(probabilities)
            del log_probs, probabilities
        count = targets.numel()
        ctx.save_for_backward(gradient)
        ctx.count = count
        ctx.used = False
        return total / count

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        if ctx.used:
            raise RuntimeError(
                "planc's loss keeps one gradient of the logits and scales it in place: run backward "
                "through it once (retain_graph=True and a second backward are not supported)"
            )
        ctx.used = True
        (gradient,) = ctx.saved_tensors
        return gradient.mul_(grad_output / ctx.count), None, None, None, None


class _ChunkLossWithGradient(torch.autograd.Function):
    """One chunk's summed cross-entropy, its gradient computed in the forward and kept for backward.

    The forward differentiates :func:`_chunk_loss_sum` at once, so the chunk's float32 tensors
    (upcast, log-softmax output, their gradients) are freed before the next chunk and only the
    gradient with respect to the chunk, in the logits' dtype, stays. Backward multiplies it by the
    incoming gradient (one elementwise pass, where recomputing would run the upcast and softmax
    again). Works on vocabulary-sharded DTensor chunks under ``loss_parallel()``, which planc's step
    holds around the forward. The gradient is not computed twice: a second backward through the
    same graph (``retain_graph``) gets the same kept gradient, scaled afresh.
    """

    @staticmethod
    def forward(ctx, chunk: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        with torch.enable_grad():
            leaf = chunk.detach().requires_grad_()
            loss = _chunk_loss_sum(leaf, targets, mask)
            (gradient,) = torch.autograd.grad(loss, leaf)
        ctx.save_for_backward(gradient)
        return loss.detach()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (gradient,) = ctx.saved_tensors
        return gradient * grad_output, None, None


def _chunk_loss_sum(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Summed float32 cross-entropy of one chunk (run under checkpoint: its float32 tensors are not kept)."""
    upcast = logits.float()
    if mask is not None:
        upcast = upcast + mask
    return F.cross_entropy(upcast, targets, reduction="sum")


def _produced(logits: torch.Tensor) -> bool:
    """Whether ``logits`` and the storage under them came out of an operation (the head's GEMM),
    not from a leaf tensor the caller made -- or a view of one, whose values the caller owns."""
    base = logits._base if logits._is_view() else logits
    return base is not None and base.grad_fn is not None


def _is_dtensor(logits: torch.Tensor) -> TypeGuard[DTensor]:
    """Whether ``logits`` is a DTensor (tensor parallelism's vocabulary-sharded logits)."""
    return hasattr(logits, "device_mesh")


def _local_width(logits: torch.Tensor) -> int:
    """Columns of ``logits`` this rank holds (a DTensor sharded over the vocabulary holds a slice)."""
    local = logits.to_local() if _is_dtensor(logits) else logits
    return max(1, local.shape[-1])


def _padding_mask(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """0 for the ``vocab`` real columns, -inf for the padding: added to the float32 logits.

    For DTensor logits the mask is a DTensor laid out like their last dimension (sharded where
    they are sharded over the vocabulary, replicated elsewhere), cut locally with no communication.
    """
    width = logits.shape[-1]
    mask = torch.zeros(width, dtype=torch.float32, device=_device(logits))
    mask[vocab:] = -math.inf
    if not _is_dtensor(logits):
        return mask
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    last = logits.ndim - 1
    placements = [Shard(0) if isinstance(p, Shard) and p.dim in (last, -1) else Replicate() for p in logits.placements]
    return distribute_tensor(mask, logits.device_mesh, placements, src_data_rank=None)


def _device(logits: torch.Tensor) -> torch.device:
    return logits.to_local().device if _is_dtensor(logits) else logits.device
