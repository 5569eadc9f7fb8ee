"""What zero-bubble's split backward costs per block, beyond one whole backward.

torch's zero-bubble schedules (``ScheduleInterleavedZeroBubble``, ``ScheduleZBVZeroBubble``) split
each stage's backward in two: input gradients (``stage_backward_input``: ``autograd.grad`` towards
the stage's inputs, keeping the graph), then weight gradients (``stage_backward_weight``), which
walks the graph again from one root per parameter group (a linear's weight and bias together, a
norm's). The kernels are the same as one backward's; the host work is not: on planc's blocks at
the CPU matrix's sizes the two halves took 0.9-1.3 ms per block more than one backward on one
quiet process (8 parameter groups in a GPT block, 9 in a Llama block), whatever the micro-batch
(2 or 8 rows), and the CPU matrix's zero-bubble cases ran 24-57 % slower than predicted without
this term (docs/accuracy.md).

Measured on one process (no collectives), as checkpointing's own work is
(:mod:`planc.calibrate.recompute_block`): planc's GPT block forward + split backward against
forward + one backward, paired alternating repetitions; the slowest rank's when several measure
at once.
"""

from __future__ import annotations

import torch

from planc.calibrate.recompute_block import gpt_block
from planc.calibrate.timing import paired_difference, slowest_rank


def measure_split_backward(device: torch.device, budget: float) -> float:
    """Seconds per block per micro-batch that the split backward takes beyond one backward (>= 0)."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    block, x = gpt_block(device)
    params = list(block.parameters())

    def clear() -> None:
        for p in params:
            p.grad = None
        x.grad = None

    def whole() -> None:
        out = block(x)
        torch.autograd.backward(out, torch.ones_like(out))
        clear()

    def split() -> None:
        out = block(x)
        _, groups = stage_backward_input([out], [torch.ones_like(out)], [x], iter(params))
        stage_backward_weight(iter(params), groups)
        clear()

    extra = paired_difference(split, whole, device, budget)
    return slowest_rank(max(0.0, extra), device)
