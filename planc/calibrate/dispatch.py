"""Host overhead per eager op: what a small model pays for every kernel, whatever its size.

Eager PyTorch spends microseconds per op on the host (dispatch, autograd recording, kernel
launch); on a GPU that hides behind the kernels while the queue stays ahead of the host, on a CPU
it adds to every op, and tiny models (the CPU equivalence matrix: hidden 32) are made of it.
Measured on a chain of :data:`CHAIN` small elementwise ops with autograd recording, forward and
backward, divided by the aten ops that ran (counted once with a ``TorchDispatchMode``, as
:mod:`planc.cost.dispatch` counts planc's program). The cost model multiplies it by the ops a
block, a micro-batch and the optimizer run.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from planc.calibrate.timing import timed

CHAIN = 100


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def measure_dispatch(device: torch.device, budget: float) -> float:
    """Seconds of host overhead per aten op (forward and backward together)."""
    x = torch.randn(8, 32, device=device, requires_grad=True)

    def step():
        y = x
        for _ in range(CHAIN):
            y = y * 1.0001
        y.sum().backward()

    with _CountOps() as counted:
        step()
    seconds = timed(step, device, budget)
    return seconds / counted.count
