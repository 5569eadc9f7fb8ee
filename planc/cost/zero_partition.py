"""How torch's ``ZeroRedundancyOptimizer`` shares the optimizer states out: whole tensors, greedily.

ZeRO-1 in planc's program is ``torch.distributed.optim.ZeroRedundancyOptimizer``. It does not cut
a flat buffer into N equal slices (DeepSpeed's and Megatron-Core's distributed optimizers do); it
gives each parameter tensor, whole, to one data-parallel rank (``_partition_parameters``): per
parameter group, the tensors sorted largest first, each to the rank with the fewest elements so
far (the lowest rank among equals), the totals carried from one group to the next. A rank's
optimizer states are those of its tensors. So the rank that receives the embedding holds at least
that matrix's states however many ranks there are: Llama 3 8B's embedding (525 M parameters) is
4.2 times an even share of the model over 64 ranks. ``planc verify --simulate`` measured the
spread on a tiny model over 8 ranks: 0.5 MiB of optimizer states on the last rank, 8 MiB on the
first, where an even share is 2.4 (tests/cost/test_zero_partition.py).

The tensors are the runtime's (:func:`planc.cost.params.stage_tensor_sizes`), per tensor-parallel
shard (DDP, under ZeRO-1, holds each shard as a plain tensor), in the optimizer's two groups
(:func:`planc.runtime.optim.parameter_groups`: matrices and embeddings first, then the 1-D
biases and norm gains). Each model part -- each pipeline chunk of a rank -- has an optimizer of
its own, and each shares its part out from rank 0 again: a rank's states are the sum over its chunks.
"""

from __future__ import annotations

import heapq
from functools import lru_cache

from planc.cost.context import CostContext
from planc.cost.estimate import StageMemory
from planc.cost.params import stage_tensor_sizes
from planc.spec.model import ModelSpec
from planc.stages import StageStyle, stages_of_rank


def greedy_partition(groups: tuple[tuple[int, ...], ...], ranks: int) -> tuple[int, ...]:
    """Elements per rank as ``ZeroRedundancyOptimizer._partition_parameters`` assigns ``groups``
    (each a parameter group's tensor sizes): largest first, each to the least-loaded rank, the
    lowest among equals; the loads carry over from one group to the next."""
    return tuple(elements for elements, _ in greedy_shares(groups, ranks))


def greedy_shares(groups: tuple[tuple[int, ...], ...], ranks: int) -> tuple[tuple[int, int], ...]:
    """(elements, tensors) per rank, assigned as :func:`greedy_partition` describes."""
    heap = [(0, rank) for rank in range(ranks)]
    tensors = [0] * ranks
    for sizes in groups:
        for size in sorted(sizes, reverse=True):
            load, rank = heapq.heappop(heap)
            heapq.heappush(heap, (load + size, rank))
            tensors[rank] += 1
    loads = [0] * ranks
    for load, rank in heap:
        loads[rank] = load
    return tuple(zip(loads, tensors))


@lru_cache(maxsize=4096)
def zero1_elements_per_rank(
    model: ModelSpec, tp: int, pp: int, virtual_stages: int, pp_rank: int, dp: int, style: StageStyle = "looped"
) -> tuple[int, ...]:
    """Parameters whose optimizer states each data-parallel rank holds, on pipeline rank ``pp_rank``
    (one TP shard): each of its chunks shared out by its own optimizer, summed."""
    return tuple(elements for elements, _ in zero1_shares_per_rank(model, tp, pp, virtual_stages, pp_rank, dp, style))


@lru_cache(maxsize=4096)
def zero1_shares_per_rank(
    model: ModelSpec, tp: int, pp: int, virtual_stages: int, pp_rank: int, dp: int, style: StageStyle = "looped"
) -> tuple[tuple[int, int], ...]:
    """(parameters, tensors) each data-parallel rank steps on pipeline rank ``pp_rank``: each of its
    chunks shared out by its own optimizer, summed."""
    totals = [(0, 0)] * dp
    for stage in stages_of_rank(pp_rank, pp, virtual_stages, style):
        matrices, vectors = stage_tensor_sizes(model, tp, pp, virtual_stages, stage)
        groups = tuple(tuple(g) for g in (matrices, vectors) if g)
        for rank, (elements, tensors) in enumerate(greedy_shares(groups, dp)):
            totals[rank] = (totals[rank][0] + elements, totals[rank][1] + tensors)
    return tuple(totals)


def partitioned_by_tensor(ctx: CostContext) -> bool:
    """Whether ``ctx``'s optimizer states are shared out tensor by tensor: torch's ZeRO-1 over
    more than one rank (another runtime's distributed optimizer cuts a flat buffer evenly)."""
    lay = ctx.layout
    return lay.zero == 1 and lay.dp > 1 and ctx.profile.torch_data_parallel


def zero1_state_elements(ctx: CostContext, pp_rank: int) -> tuple[int, ...]:
    """:func:`zero1_elements_per_rank` for ``ctx``'s layout."""
    lay = ctx.layout
    return zero1_elements_per_rank(ctx.model, lay.tp, lay.pp, lay.virtual_stages, pp_rank, lay.dp, ctx.stage_style)


def zero1_busiest_share(ctx: CostContext) -> tuple[int, int]:
    """(parameters, tensors) of the rank that steps the most parameters, over every pipeline and
    data-parallel rank: ``ZeroRedundancyOptimizer`` broadcasts each rank's parameters after its
    step, so the step lasts as long as that rank's."""
    lay = ctx.layout
    return max(
        share
        for st in ctx.stages
        for share in zero1_shares_per_rank(
            ctx.model, lay.tp, lay.pp, lay.virtual_stages, st.rank, lay.dp, ctx.stage_style
        )
    )


def with_zero1_share(ctx: CostContext, memory: StageMemory, elements: int) -> StageMemory:
    """``memory`` with the master and optimizer states of ``elements`` parameters."""
    return memory.updated(master=ctx.state_bytes.master * elements, optimizer=ctx.state_bytes.optimizer * elements)
