"""Time and peak memory of the loss over one micro-batch's logits: the whole-tensor float32
cross-entropy against planc's chunked loss, each way and at several chunk sizes, side by side.

    python bench/loss_speed.py [--tokens 8192] [--vocab 128256] [--reps 10]

The logits ``[tokens, vocab]`` (bf16 on CUDA, as the head GEMM writes them under autocast; fp32 on
CPU) come out of an op that keeps nothing for backward and passes on only a [vocab] gradient (a
bias: the head's own input and weight gradients are not the loss's); each variant runs forward and
backward ``reps`` times and prints the median time (after a device synchronisation) and, on CUDA,
the peak memory above the logits' input (``torch.cuda.max_memory_allocated``, the logits included;
on CPU bench/loss_memory.py measures the peaks). ``in_forward`` writes the gradient over the logits,
as planc's step runs it. On one H100 this showed what planc's loss cost beside a plain
``F.cross_entropy`` on Llama 3 8B's vocabulary (docs/gpu.md); on CPU the defaults are smaller.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from planc.runtime.loss import chunked_cross_entropy


def variants(chunks: list[int]) -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = [("whole", lambda x, t: F.cross_entropy(x.float(), t))]
    for c in chunks:
        for backward in ("in_forward", "recompute"):
            found.append(
                (
                    f"{backward} 2^{c.bit_length() - 1}",
                    lambda x, t, c=c, b=backward: chunked_cross_entropy(
                        x, t, chunk_elements=c, backward=b, overwrite_logits=b == "in_forward"
                    ),
                )
            )
    return found


def measure(fn, head_out: torch.Tensor, targets: torch.Tensor, reps: int) -> tuple[float, int]:
    cuda = head_out.is_cuda
    bias = torch.zeros(head_out.shape[-1], device=head_out.device, dtype=head_out.dtype, requires_grad=True)
    times = []
    peak = 0
    for _ in range(reps + 1):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        began = time.perf_counter()
        logits = head_out + bias
        loss = fn(logits, targets)
        del logits
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
            peak = max(peak, torch.cuda.max_memory_allocated() - base)
        times.append(time.perf_counter() - began)
        bias.grad = None
    return statistics.median(times[1:]), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cuda = torch.cuda.is_available()
    parser.add_argument("--tokens", type=int, default=8192 if cuda else 1024)
    parser.add_argument("--vocab", type=int, default=128256 if cuda else 32768)
    parser.add_argument("--reps", type=int, default=10 if cuda else 3)
    parser.add_argument("--chunks", type=int, nargs="*", default=[24, 25, 26, 27] if cuda else [20, 22])
    args = parser.parse_args()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    generator = torch.Generator(device=device).manual_seed(0)
    head_out = torch.randn(args.tokens, args.vocab, device=device, generator=generator).to(dtype)
    targets = torch.randint(0, args.vocab, (args.tokens,), device=device, generator=generator)
    gib = 2**30
    logits_gib = head_out.numel() * head_out.element_size() / gib
    print(f"{args.tokens} tokens x {args.vocab} vocabulary, {dtype} logits ({logits_gib:.2f} GiB), {device}")
    rows = [(name, *measure(fn, head_out, targets, args.reps)) for name, fn in variants([2**c for c in args.chunks])]
    whole = rows[0][1]
    for name, seconds, peak in rows:
        print(
            f"RESULT loss {name:>16}: {seconds * 1e3:7.2f} ms  ({seconds / whole:.3f} of whole)"
            + (f"  peak {peak / gib:6.2f} GiB" if cuda else "")
        )


if __name__ == "__main__":
    main()
