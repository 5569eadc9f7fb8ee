"""Streaming memory bandwidth: STREAM's "triad" a = b + s * c on large tensors (McCalpin 1995).

Bytes counted as STREAM counts them: two reads and one write per element, 3 x 4 bytes in fp32.
The result is a sustained rate, used by the cost model as is (no further efficiency factor) for
its memory-bound kernels (norms, casts, activations, the optimizer step). ``torch.add(b, c,
alpha=s, out=a)`` is one kernel on CUDA and one vectorised loop on CPU.
"""

from __future__ import annotations

import torch

from planc.calibrate.timing import timed

#: Large enough to leave every cache: 64 Mi elements (256 MiB) per array on GPU, 16 Mi (64 MiB) on CPU.
ELEMENTS = {"cuda": 64 * 2**20, "cpu": 16 * 2**20}


def measure_memory_bandwidth(device: torch.device, budget: float) -> float:
    """Bytes per second moved by the triad."""
    n = ELEMENTS[device.type]
    a, b, c = (torch.empty(n, device=device, dtype=torch.float32).fill_(1.0) for _ in range(3))
    seconds = timed(lambda: torch.add(b, c, alpha=3.0, out=a), device, budget)
    return 3 * 4 * n / seconds
