"""GEMM throughput: ``torch.matmul`` of (m x k) @ (k x n) at each shape, FLOP/s = 2 m k n / seconds.

Shapes whose single GEMM would exceed :data:`MAX_FLOPS_PER_CALL` (a CPU meeting an 8 B model's
shapes) are measured with fewer rows m: throughput stops growing with m long before that, and the
profile records the shape that actually ran (the cost model looks up the nearest shape).
"""

from __future__ import annotations

from functools import partial

import torch

from planc.calibrate.timing import timed
from planc.spec.hardware_profile import GemmRate

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: About 1 s on a CPU core pair at 100 GFLOP/s, 0.2 ms on an H100.
MAX_FLOPS_PER_CALL = {"cpu": 2e10, "cuda": 2e14}


def measure_gemms(shapes, dtype: str, device: torch.device, budget: float) -> list[GemmRate]:
    """The sustained rate of each shape, ``budget`` seconds of repetitions each."""
    rates = []
    cap = MAX_FLOPS_PER_CALL[device.type]
    for m, k, n in shapes:
        m = max(1, min(m, int(cap / (2 * k * n))))
        a = torch.randn(m, k, device=device, dtype=DTYPES[dtype])
        b = torch.randn(k, n, device=device, dtype=DTYPES[dtype])
        seconds = timed(partial(torch.matmul, a, b), device, budget)
        rates.append(GemmRate(m=m, k=k, n=n, dtype=dtype, flops=2.0 * m * k * n / seconds))
    return rates
