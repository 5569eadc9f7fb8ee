"""``bf16``: bf16 compute with fp32 master weights and optimizer states.

* With FSDP (ZeRO-2/3): sets ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``
  on the job; ``fsdp`` passes it to ``fully_shard``, which all-gathers bf16 copies of the fp32
  sharded parameters and reduce-scatters gradients in fp32.
* Otherwise: each model part's forward runs under ``torch.autocast(dtype=bfloat16)`` (matmuls in
  bf16, reductions such as norms and the loss in fp32); parameters, gradients and optimizer
  states stay fp32.

It is applied *before* the data-parallel strategies (unlike the "precision last" of the
composition diagram) because FSDP2 takes its MixedPrecisionPolicy only at wrap time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from planc.strategies.api import StrategyOptions
from planc.strategies.bf16.cost_pass import cost as cost  # the plan-time cost pass (a contract hook)
from planc.strategies.composition import after

if TYPE_CHECKING:
    from planc.runtime.job import Job
    from planc.spec.layout import Layout
    from planc.spec.plan import Plan

NAME = "bf16"
API_VERSION = 1
DESCRIPTION = "bf16 compute, fp32 master weights: FSDP2 MixedPrecisionPolicy, else torch.autocast"
AFTER: tuple[str, ...] = after(NAME)


class Options(StrategyOptions):
    """Options of ``use bf16 { ... }``."""

    reduce_dtype: Literal["fp32", "bf16"] = "fp32"
    """Precision of FSDP's gradient reduce-scatter (fp32 is exact; bf16 halves its traffic)."""


def enabled(plan: Plan, layout: Layout) -> bool:
    """The plan trains in bf16."""
    return plan.train.precision == "bf16"


def check(plan: Plan, layout: Layout, options: Options) -> str | None:
    if plan.train.precision != "bf16":
        return "bf16 needs train { precision = bf16 }"
    return None


def apply(job: Job, options: Options) -> None:
    """Offer the bf16 policy on the job: FSDP takes it at wrap time, or the forward is autocast."""
    from planc.strategies.bf16.runtime import offer_bf16

    offer_bf16(job, reduce_in_fp32=options.reduce_dtype == "fp32")
