"""``recompute``: activation recomputation per transformer block (``torch.utils.checkpoint``).

* ``full``: each block is wrapped in ``checkpoint_wrapper`` (non-reentrant
  ``torch.utils.checkpoint``): only the block's input is kept; the whole block is recomputed
  in backward (Chen et al. 2016; Korthikanti et al. 2022, §5 "full").
* ``selective``: the same wrapper with a ``create_selective_checkpoint_contexts`` policy that
  saves the outputs of the matrix multiplications, of attention (SDPA) and of tensor-parallel
  collectives, and recomputes everything else -- the cheap, memory-hungry element-wise ops
  (norms, activations, softmax inputs, dropout-free residual adds) and the output projections'
  matmuls, whose results no-recompute does not keep either. This is Korthikanti et al.'s
  selective recomputation in spirit: keep what is expensive to recompute, drop what is cheap,
  and never keep more than no recomputation would (``recompute/runtime.py``).

``checkpoint_wrapper`` keeps checkpoint FQNs unchanged (its state-dict hooks strip the
``_checkpoint_wrapped_module`` segment).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from planc.strategies.api import StrategyOptions
from planc.strategies.composition import after
from planc.strategies.recompute.cost_pass import cost as cost  # the plan-time cost pass (a contract hook)

if TYPE_CHECKING:
    from planc.runtime.job import Job
    from planc.spec.layout import Layout
    from planc.spec.plan import Plan

NAME = "recompute"
API_VERSION = 1
DESCRIPTION = "Activation recomputation per block: full, or selective (save matmul/attention outputs)"
AFTER: tuple[str, ...] = after(NAME)


class Options(StrategyOptions):
    """Options of ``use recompute { ... }``."""

    FROM_LAYOUT = {"mode": lambda layout: layout.recompute if layout.recompute != "none" else None}

    mode: Literal["full", "selective"] | None = None
    """full (recompute each block) or selective (save matmul/attention outputs); default: the layout's."""


def enabled(plan: Plan, layout: Layout) -> bool:
    """The layout recomputes activations."""
    return layout.recompute != "none"


def resolved_mode(layout: Layout, options: Options) -> str:
    return options.mode or layout.recompute


def check(plan: Plan, layout: Layout, options: Options) -> str | None:
    if options.mode is not None and options.mode != layout.recompute:
        return (
            f"mode = {options.mode} contradicts the layout's recompute = {layout.recompute}; "
            "set layout { recompute = ... } instead"
        )
    return None


def apply(job: Job, options: Options) -> None:
    """Wrap every local transformer block in ``checkpoint_wrapper`` (full or selective)."""
    from planc.strategies.recompute.runtime import wrap_blocks

    wrap_blocks(job, resolved_mode(job.layout, options))
