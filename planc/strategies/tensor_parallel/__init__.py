"""``tensor_parallel``: Megatron-style tensor parallelism with DTensor ``parallelize_module``.

Over the "tp" mesh dimension (Shoeybi et al. 2019, §3; PyTorch's ``torch.distributed.tensor.parallel``):

* attention: ``wq``/``wk``/``wv`` column-parallel (each rank runs heads/tp query heads and
  kv_heads/tp key/value heads -- grouped-query attention needs tp | kv_heads), ``wo`` row-parallel;
* MLP: ``w1``/``w3`` column-parallel, ``w2`` row-parallel -- one all-reduce per sub-layer;
* the token embedding vocabulary-parallel (``RowwiseParallel``), the output projection
  column-parallel with vocabulary-sharded logits (``Shard(-1)``) that the loss consumes under
  ``loss_parallel()`` without ever gathering them;
* with sequence parallelism (Korthikanti et al. 2022, §4.2.2) the norms run on sequence shards
  (``SequenceParallel``) and each sub-layer's all-reduce becomes a reduce-scatter + all-gather;
* every other parameter (norms without sequence parallelism, learned position embeddings)
  becomes a replicated DTensor, so all parameters live on the same mesh for clipping and FSDP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planc.legality import rules as legality
from planc.spec.fields import Flag
from planc.strategies.api import StrategyOptions
from planc.strategies.composition import after
from planc.strategies.tensor_parallel.cost_pass import cost as cost  # the plan-time cost pass (a contract hook)

if TYPE_CHECKING:
    from planc.runtime.job import Job
    from planc.spec.layout import Layout
    from planc.spec.plan import Plan

NAME = "tensor_parallel"
API_VERSION = 1
DESCRIPTION = "Tensor parallelism: DTensor parallelize_module (column/row-parallel, vocab-parallel, loss parallel, SP)"
AFTER: tuple[str, ...] = after(NAME)


class Options(StrategyOptions):
    """Options of ``use tensor_parallel { ... }``."""

    FROM_LAYOUT = {"sequence_parallel": lambda layout: layout.sequence_parallel}

    sequence_parallel: Flag | None = None
    """Shard norms along the sequence (default: the layout's sequence_parallel)."""
    loss_parallel: Flag = True
    """Compute the cross-entropy on vocabulary-sharded logits instead of gathering them."""


def enabled(plan: Plan, layout: Layout) -> bool:
    """Tensor-parallel degree above 1."""
    return layout.tp > 1


def check(plan: Plan, layout: Layout, options: Options) -> str | None:
    """The tensor-parallel rules of :mod:`planc.legality`, and the use block agreeing with the layout."""
    found = legality.tensor_parallel_violations(plan, layout, uses_sequence_parallel(layout, options))
    if found:
        return str(found[0])
    if options.sequence_parallel is not None and options.sequence_parallel != layout.sequence_parallel:
        return (
            "the use block's sequence_parallel contradicts the layout's; set layout { sequence_parallel = ... } instead"
        )
    return None


def uses_sequence_parallel(layout: Layout, options: Options) -> bool:
    return layout.sequence_parallel if options.sequence_parallel is None else options.sequence_parallel


def apply(job: Job, options: Options) -> None:
    """``parallelize_module`` each local model part over the "tp" mesh dimension (on the meta device)."""
    from planc.strategies.tensor_parallel.runtime import parallelize

    sequence_parallel = uses_sequence_parallel(job.layout, options)
    for part in job.transformers():
        parallelize(part, job.mesh["tp"], sequence_parallel=sequence_parallel, loss_parallel=options.loss_parallel)
    job.loss_parallel = options.loss_parallel
