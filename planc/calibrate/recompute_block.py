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
plain block's and one plain forward (what the cost model already prices, in full), per block
and micro-batch, for planc's ``wrap_block`` in both modes. Paired, alternating repetitions
(:func:`planc.calibrate.timing.paired_difference`, as the strategy wrappers are measured); the
slowest rank's when several measure at once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from planc.calibrate.timing import paired_difference, slowest_rank
from planc.calibrate.tp_block import BATCH, SPEC
from planc.spec.model import ModelSpec


def measure_recompute(device: torch.device, budget: float, autocast: bool = False) -> tuple[float, float]:
    """(full, selective) seconds per block per micro-batch beyond one rerun forward (>= 0), the
    slowest rank's when a process group is up. ``autocast``: every step under bf16 autocast, as
    planc's bf16 program without FSDP2 runs (the casts are ops the selective policy is asked about
    too; on one process here selective's own work read 1.3-1.45x its fp32 figure)."""
    from planc.strategies.recompute.runtime import wrap_block

    block, x = gpt_block(device)
    plain = _autocast(_step(block, x), device, autocast)

    def rerun() -> None:
        block(x)

    rerun_forward = _autocast(rerun, device, autocast)

    def plain_and_rerun() -> None:
        # The reference holds the rerun forward itself, so that it is paired with the wrapped step
        # like the rest: timed apart, it left differences that were mostly a loaded machine's noise.
        plain()
        rerun_forward()

    def beyond_rerun(mode: str) -> float:
        wrapped = _autocast(_step(wrap_block(copy.deepcopy(block), mode), x), device, autocast)
        return slowest_rank(max(0.0, paired_difference(wrapped, plain_and_rerun, device, budget)), device)

    return beyond_rerun("full"), beyond_rerun("selective")


def _autocast(step: Callable[[], None], device: torch.device, enabled: bool) -> Callable[[], None]:
    """``step`` run under bf16 autocast when ``enabled``, else ``step`` itself."""
    if not enabled:
        return step

    def under_autocast() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            step()

    return under_autocast


def gpt_block(device: torch.device) -> tuple[torch.nn.Module, torch.Tensor]:
    """planc's GPT block at the calibration's sizes and an input that asks for its gradient."""
    from planc.runtime.transformer import TransformerBlock

    torch.manual_seed(0)
    block = TransformerBlock(ModelSpec.model_validate(SPEC)).to(device)
    x = torch.randn(BATCH, SPEC["seq_len"], SPEC["hidden"], device=device, requires_grad=True)
    return block, x


def _step(block: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        block(x).sum().backward()
        for p in block.parameters():
            p.grad = None
        x.grad = None

    return step
