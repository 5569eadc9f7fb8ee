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

The tensors are the runtime's (:mod:`planc.runtime.transformer`), per tensor-parallel shard (DDP,
under ZeRO-1, holds each shard as a plain tensor), in the optimizer's two groups
(:func:`planc.runtime.optim.parameter_groups`: matrices and embeddings first, then the 1-D
biases and norm gains). Each model part -- each pipeline chunk of a rank -- has an optimizer of
its own, and each shares its part out from rank 0 again: a rank's states are the sum over its chunks.
"""

from __future__ import annotations

import heapq
from functools import lru_cache

from planc.cost.context import CostContext
from planc.cost.estimate import StageMemory
from planc.spec.model import ModelSpec
from planc.stages import StageStyle, chunk_layer_counts, stages_of_rank


def block_tensors(model: ModelSpec, tp: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(matrices, vectors): element counts of one block's parameter tensors on one TP rank.

    Column-parallel (wq, wk, wv, the MLP's input projections) split their weights and biases by
    ``tp``; row-parallel (wo, the MLP's output) their weights, their biases are replicated; norms
    are replicated (:func:`planc.cost.params.layer_params_per_shard` counts the same)."""
    h, f, q, kv = model.hidden, model.ffn, model.heads * model.head_dim, model.kv_dim
    mlp_in = 2 if model.mlp == "swiglu" else 1
    matrices = (h * q // tp, h * kv // tp, h * kv // tp, q * h // tp) + (h * f // tp,) * mlp_in + (f * h // tp,)
    vectors: list[int] = []
    if model.bias or model.qkv_bias:
        vectors += [q // tp, kv // tp, kv // tp]
    if model.bias:
        vectors += [h] + [f // tp] * mlp_in + [h]
    vectors += _norm_tensors(model) * 2
    return matrices, tuple(vectors)


def _norm_tensors(model: ModelSpec) -> list[int]:
    """One norm's tensors: a weight, and a bias for a biased LayerNorm."""
    return [model.hidden] * (2 if model.norm == "layernorm" and model.bias else 1)


def chunk_tensors(model: ModelSpec, tp: int, pp: int, virtual_stages: int, stage: int) -> tuple[list[int], list[int]]:
    """(matrices, vectors) of pipeline stage ``stage`` (one model part) on one TP rank: its blocks,
    the embeddings on the first stage, the final norm and head on the last (a copy of the tied
    embedding when the head is on another stage than the embedding)."""
    stages = pp * virtual_stages
    layers = chunk_layer_counts(model.layers, stages)[stage]
    block_matrices, block_vectors = block_tensors(model, tp)
    matrices, vectors = list(block_matrices) * layers, list(block_vectors) * layers
    if stage == 0:
        matrices.append(model.padded_vocab * model.hidden // tp)
        if model.position == "learned":
            matrices.append(model.seq_len * model.hidden)
    if stage == stages - 1:
        vectors += _norm_tensors(model)
        if not (model.tie_embeddings and stages == 1):
            matrices.append(model.padded_vocab * model.hidden // tp)
    return matrices, vectors


def greedy_partition(groups: tuple[tuple[int, ...], ...], ranks: int) -> tuple[int, ...]:
    """Elements per rank as ``ZeroRedundancyOptimizer._partition_parameters`` assigns ``groups``
    (each a parameter group's tensor sizes): largest first, each to the least-loaded rank, the
    lowest among equals; the loads carry over from one group to the next."""
    heap = [(0, rank) for rank in range(ranks)]
    for sizes in groups:
        for size in sorted(sizes, reverse=True):
            load, rank = heapq.heappop(heap)
            heapq.heappush(heap, (load + size, rank))
    loads = [0] * ranks
    for load, rank in heap:
        loads[rank] = load
    return tuple(loads)


@lru_cache(maxsize=4096)
def zero1_elements_per_rank(
    model: ModelSpec, tp: int, pp: int, virtual_stages: int, pp_rank: int, dp: int, style: StageStyle = "looped"
) -> tuple[int, ...]:
    """Parameters whose optimizer states each data-parallel rank holds, on pipeline rank ``pp_rank``
    (one TP shard): each of its chunks shared out by its own optimizer, summed."""
    totals = [0] * dp
    for stage in stages_of_rank(pp_rank, pp, virtual_stages, style):
        matrices, vectors = chunk_tensors(model, tp, pp, virtual_stages, stage)
        groups = tuple(tuple(g) for g in (matrices, vectors) if g)
        for rank, load in enumerate(greedy_partition(groups, dp)):
            totals[rank] += load
    return tuple(totals)


def zero1_state_elements(ctx: CostContext, pp_rank: int) -> tuple[int, ...]:
    """:func:`zero1_elements_per_rank` for ``ctx``'s layout."""
    lay = ctx.layout
    return zero1_elements_per_rank(ctx.model, lay.tp, lay.pp, lay.virtual_stages, pp_rank, lay.dp, ctx.stage_style)


def with_zero1_share(ctx: CostContext, memory: StageMemory, elements: int) -> StageMemory:
    """``memory`` with the master and optimizer states of ``elements`` parameters."""
    return memory.updated(master=ctx.state_bytes.master * elements, optimizer=ctx.state_bytes.optimizer * elements)
