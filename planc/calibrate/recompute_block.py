"""What activation checkpointing itself costs per block, beyond the forward it reruns.

The cost model prices recomputation as the rerun forward (full: the whole block forward;
selective: the part planc's policy does not save). PyTorch's checkpointing adds host work of its
own on top: ``checkpoint_wrapper``'s non-reentrant machinery (saved-tensor hooks, the recompute's
frame bookkeeping), and under selective recomputation a ``TorchDispatchMode`` that asks the policy
about every aten op of the forward and of the recompute. On planc's own GPT block at the CPU
matrix's sizes (hidden 32, 16 tokens x 8) that is ~0.8 ms per block for full and ~2 ms for
selective against a 0.9 ms forward + backward: where the CPU matrix's recomputing cases ran
twice their prediction (docs/accuracy.md).

Measured on one process (no collectives): the checkpointed block's forward + backward, less the
plain block's, less one plain forward (what the cost model already prices, in full), per block
and micro-batch, for planc's ``wrap_block`` in both modes. Paired, alternating repetitions, as
the strategy wrappers are measured (:func:`planc.calibrate.wrappers._extra`); the slowest rank's
when several measure at once.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable

import torch

from planc.calibrate.timing import median_seconds, repeats_for
from planc.calibrate.tp_block import BATCH, SPEC
from planc.spec.model import ModelSpec


def measure_recompute(device: torch.device, budget: float) -> tuple[float, float]:
    """(full, selective) seconds per block per micro-batch beyond one rerun forward (>= 0)."""
    from planc.runtime.transformer import TransformerBlock
    from planc.strategies.recompute.runtime import wrap_block

    torch.manual_seed(0)
    block = TransformerBlock(ModelSpec.model_validate(SPEC)).to(device)
    x = torch.randn(BATCH, SPEC["seq_len"], SPEC["hidden"], device=device, requires_grad=True)
    plain = _step(block, x)

    def forward() -> None:
        block(x)

    rerun = median_seconds(forward, device, repeats=repeats_for(_probe(forward, device), budget), warmup=2)
    full = _beyond(_step(wrap_block(copy.deepcopy(block), "full"), x), plain, device, budget) - rerun
    selective = _beyond(_step(wrap_block(copy.deepcopy(block), "selective"), x), plain, device, budget) - rerun
    return _slowest_rank(max(0.0, full), device), _slowest_rank(max(0.0, selective), device)


def _step(block: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        block(x).sum().backward()
        for p in block.parameters():
            p.grad = None
        x.grad = None

    return step


def _probe(fn: Callable[[], None], device: torch.device) -> float:
    return median_seconds(fn, device, repeats=1, warmup=1)


def _beyond(fn: Callable[[], None], reference: Callable[[], None], device: torch.device, budget: float) -> float:
    """Median of (``fn`` - ``reference``) over alternating repetitions."""
    fn()
    reference()
    differences = []
    for _ in range(repeats_for(2 * _probe(fn, device), budget, least=5)):
        differences.append(
            median_seconds(fn, device, repeats=1, warmup=0) - median_seconds(reference, device, repeats=1, warmup=0)
        )
    return statistics.median(differences)


def _slowest_rank(seconds: float, device: torch.device) -> float:
    import torch.distributed as dist

    if not dist.is_initialized():
        return seconds
    value = torch.tensor([seconds], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value)
