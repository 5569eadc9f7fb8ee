"""Peak memory of the logits and the loss, measured: the old whole-tensor float32 loss against the chunked one.

    python bench/loss_memory.py          # a table: measured peaks, the cost model's prediction, ratios

One micro-batch's logits ``[b, s, V]`` (bf16 as the head GEMM writes them under autocast, or fp32)
come out of an op whose backward keeps nothing (as a Linear keeps nothing of its output) and
passes on only a small gradient (a bias over the vocabulary), the loss
runs forward and backward, and :class:`PeakBytes` -- a ``TorchDispatchMode`` that adds every new
storage an op returns and subtracts it when it is freed (``weakref.finalize``) -- records the
largest total alive at any op: the logits, the loss's float32 temporaries and the logits' gradient.
That is the term :func:`planc.cost.memory.logits_bytes` predicts (the head's input and weight
gradients are the head's own).

``old`` is ``F.cross_entropy(logits.float(), targets)`` (planc's loss before the chunking);
``in_forward`` and ``recompute`` are :func:`planc.runtime.loss.chunked_cross_entropy` with each
chunk's gradient computed in the forward and written over the logits (planc's loss) or recomputed
in backward (vocabulary-sharded logits on a GPipe or zero-bubble pipeline's last stage: the cost
model's ``chunked_recompute``, measured here on plain logits through the same path). The test
(tests/runtime/test_loss.py) runs the same cases.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from planc.cost.memory import logits_bytes
from planc.runtime.loss import chunked_cross_entropy
from planc.spec import build_plan


class PeakBytes(TorchDispatchMode):
    """The largest number of bytes of storages created under this mode that were alive at once."""

    def __init__(self):
        super().__init__()
        self.sizes: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _freed(self, key: int) -> None:
        self.current -= self.sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                key = storage._cdata
                if key not in self.sizes:
                    self.sizes[key] = storage.nbytes()
                    self.current += storage.nbytes()
                    weakref.finalize(storage, self._freed, key)
        self.peak = max(self.peak, self.current)
        return out


def old_loss(logits: torch.Tensor, targets: torch.Tensor, vocab: int) -> torch.Tensor:
    """planc's loss before the chunking: the whole logits tensor upcast at once (no padding mask)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def measure(kind: str, b: int, s: int, vocab: int, padded: int, dtype: torch.dtype, chunk_elements: int) -> int:
    """Peak bytes of the logits, the loss and the logits' gradient for one micro-batch."""
    generator = torch.Generator().manual_seed(0)
    head_out = torch.randn(b, s, padded, generator=generator).to(dtype)
    bias = torch.zeros(padded, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, vocab, (b, s), generator=generator)
    with PeakBytes() as peak:
        # A fresh tensor whose backward keeps nothing, as a Linear keeps nothing of its output, and
        # hands on only a [V] gradient: the head's own input and weight gradients are not this term.
        logits = head_out + bias
        if kind == "old":
            loss = old_loss(logits, targets, vocab)
        else:
            loss = chunked_cross_entropy(
                logits,
                targets,
                vocab=vocab,
                chunk_elements=chunk_elements,
                backward=kind,
                overwrite_logits=kind == "in_forward",  # as planc's step runs it
            )
        del logits
        loss.backward()
        del loss
    return peak.peak


def predicted(b: int, s: int, vocab: int, padded: int, dtype: torch.dtype, chunk_elements: int, kind: str) -> float:
    plan = build_plan(
        {
            "model": dict(layers=1, hidden=64, heads=4, vocab=vocab, seq_len=s, vocab_multiple=padded),
            "hardware": {"device": "cpu"},
            "train": {"global_batch": b},
        }
    )
    assert plan.model.padded_vocab == padded
    loss = "chunked" if kind == "in_forward" else "chunked_recompute"
    e = torch.tensor([], dtype=dtype).element_size()
    return logits_bytes(plan.model, b, 1, e, chunk_elements=chunk_elements, loss=loss)


#: (b, s, vocab, padded vocab, chunk elements): several chunks, a ragged last chunk, one chunk.
CASES = [
    (4, 256, 4000, 4096, 2**18),
    (2, 300, 5000, 5120, 2**18),
    (2, 64, 1000, 1024, 2**18),
]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


#: The chunked loss's two ways, as measure() names them.
KINDS = ("in_forward", "recompute")


def run() -> list[dict]:
    results = []
    for b, s, vocab, padded, chunk in CASES:
        for name, dtype in DTYPES.items():
            old = measure("old", b, s, vocab, padded, dtype, chunk)
            for kind in KINDS:
                results.append(
                    dict(
                        b=b,
                        s=s,
                        padded=padded,
                        chunk=chunk,
                        dtype=name,
                        kind=kind,
                        logits=b * s * padded * dtype.itemsize,
                        old=old,
                        chunked=measure(kind, b, s, vocab, padded, dtype, chunk),
                        predicted=predicted(b, s, vocab, padded, dtype, chunk, kind),
                    )
                )
    return results


def main() -> None:
    print(
        f"{'b x s x V':>18} {'dtype':>5} {'chunk':>8} {'backward':>10} {'logits':>9} {'old':>9} {'chunked':>9} "
        f"{'predicted':>9} {'old/logits':>10} {'new/logits':>10} {'new/pred':>8}"
    )
    mib = 2**20
    for r in run():
        shape = f"{r['b']} x {r['s']} x {r['padded']}"
        print(
            f"{shape:>18} {r['dtype']:>5} {r['chunk']:>8} {r['kind']:>10} {r['logits'] / mib:>8.1f}M "
            f"{r['old'] / mib:>8.1f}M {r['chunked'] / mib:>8.1f}M {r['predicted'] / mib:>8.1f}M "
            f"{r['old'] / r['logits']:>10.2f} {r['chunked'] / r['logits']:>10.2f} {r['chunked'] / r['predicted']:>8.3f}"
        )


if __name__ == "__main__":
    main()
