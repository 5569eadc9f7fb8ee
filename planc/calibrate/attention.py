"""Causal attention throughput: ``scaled_dot_product_attention(is_causal=True)``, forward and backward.

FLOPs are counted as the cost model counts them (:func:`planc.cost.compute.block_times`): forward
4 b s^2 a d / 2 (two matmuls over the unmasked half), backward 2.5 x that (Dao 2023: five matmuls
to the forward's two). The rates are then what the cost model divides by: whatever kernel torch
chose on this device (flash, memory-efficient, cuDNN, or the CPU's) is what was measured.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from planc.calibrate.gemm import DTYPES
from planc.calibrate.timing import timed
from planc.spec.hardware_profile import AttentionRate


def measure_attention(shapes, dtype: str, device: torch.device, budget: float) -> list[AttentionRate]:
    rates = []
    for batch, heads, seq_len, head_dim in shapes:
        q, k, v = (
            torch.randn(batch, heads, seq_len, head_dim, device=device, dtype=DTYPES[dtype], requires_grad=True)
            for _ in range(3)
        )

        def forward(q=q, k=k, v=v):
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def forward_backward(q=q, k=k, v=v):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(torch.ones_like(out))

        fwd = timed(forward, device, budget / 2)
        both = timed(forward_backward, device, budget / 2)
        flops = 4.0 * batch * seq_len * seq_len * heads * head_dim * 0.5
        rates.append(
            AttentionRate(
                batch=batch,
                heads=heads,
                seq_len=seq_len,
                head_dim=head_dim,
                dtype=dtype,
                forward_flops=flops / fwd,
                backward_flops=2.5 * flops / max(both - fwd, 1e-9),
            )
        )
    return rates
