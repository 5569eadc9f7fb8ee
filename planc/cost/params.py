"""Parameters per pipeline stage and per tensor-parallel shard.

Counts start from the exact numbers of :class:`~planc.spec.ModelSpec` (``params_per_layer``,
``params_embedding``, ``params_output``: the model the runtime builds) and split them the way
the runtime does:

- **Pipeline**: the ``layers`` blocks are cut into ``pp * v`` contiguous stages and placed on
  ranks exactly as the runtime places them: :mod:`planc.stages` (looped, or V-shaped under ZBV,
  where rank 0 holds the embedding *and* the head). The embedding lives on stage 0, the final
  norm and output head on the last stage.
- **Tensor parallel** (Shoeybi et al. 2019, Sec. 3; torch DTensor colwise/rowwise plans): the
  QKV and MLP-in matrices are split by columns (their biases too), the attention-out and
  MLP-out matrices by rows (their biases are *replicated*: added after the all-reduce); norms
  are replicated; the embedding and output head are split by vocabulary rows (vocab-parallel).
  Learned position embeddings are replicated.
- **Tied embeddings** with pp > 1: the last stage keeps its own copy of the embedding matrix as
  the head (Megatron's ``shared_embedding``), counted there (ZBV refuses tied embeddings).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from planc.spec.model import ModelSpec
from planc.stages import StageStyle, chunk_layer_counts, holds_embedding, holds_head, stages_of_rank


def layer_params_per_shard(model: ModelSpec, tp: int) -> int:
    """Parameters of one transformer block held by one TP rank.

    Column-parallel (sharded with their biases): QKV, MLP-in (gelu fc1; swiglu gate and up).
    Row-parallel (weights sharded, biases replicated): attention-out, MLP-out. Norms replicated.
    At tp = 1 this equals ``model.params_per_layer``.
    """
    matrices, vectors = block_tensor_sizes(model, tp)
    return sum(matrices) + sum(vectors)


def vocab_matrix_per_shard(model: ModelSpec, tp: int) -> int:
    """One vocabulary-parallel [V, h] matrix -- the token embedding or the output head -- on one TP rank."""
    return model.padded_vocab * model.hidden // tp


def linear_params_per_shard(model: ModelSpec, tp: int) -> int:
    """Weights and biases of one block's linears on one TP rank: the block less its two norms,
    whose weights ``torch.autocast`` leaves in fp32 (norms run in fp32; only the linears' are cast)."""
    return layer_params_per_shard(model, tp) - 2 * sum(_norm_tensor_sizes(model))


def mlp_params_per_shard(model: ModelSpec, tp: int) -> int:
    """Weights and biases of one block's MLP on one TP rank: the largest parameter group of torch's
    split backward (``stage_backward_weight`` takes one group's weight gradients at a time)."""
    h, f = model.hidden, model.ffn
    mlp_in = 2 if model.mlp == "swiglu" else 1
    biases = mlp_in * f // tp + h if model.bias else 0
    return (mlp_in + 1) * h * f // tp + biases


def block_tensor_sizes(model: ModelSpec, tp: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(matrices, vectors): element counts of one block's parameter tensors on one TP rank.

    Column-parallel (wq, wk, wv, the MLP's input projections) split their weights and biases by
    ``tp``; row-parallel (wo, the MLP's output) their weights, their biases are replicated; norms
    are replicated. Their sum is :func:`layer_params_per_shard`; ZeRO-1's partition needs them one
    by one, split as the optimizer's parameter groups are (:mod:`planc.cost.zero_partition`)."""
    h, f, q, kv = model.hidden, model.ffn, model.heads * model.head_dim, model.kv_dim
    mlp_in = 2 if model.mlp == "swiglu" else 1
    matrices = (h * q // tp, h * kv // tp, h * kv // tp, q * h // tp) + (h * f // tp,) * mlp_in + (f * h // tp,)
    vectors: list[int] = []
    if model.bias or model.qkv_bias:
        vectors += [q // tp, kv // tp, kv // tp]
    if model.bias:
        vectors += [h] + [f // tp] * mlp_in + [h]
    vectors += _norm_tensor_sizes(model) * 2
    return matrices, tuple(vectors)


def _norm_tensor_sizes(model: ModelSpec) -> list[int]:
    """One norm's tensors: a weight, and a bias for a biased LayerNorm."""
    return [model.hidden] * (2 if model.norm == "layernorm" and model.bias else 1)


def stage_tensor_sizes(
    model: ModelSpec, tp: int, pp: int, virtual_stages: int, stage: int
) -> tuple[list[int], list[int]]:
    """(matrices, vectors) of pipeline stage ``stage`` (one model part) on one TP rank: its blocks,
    the embeddings on the first stage, the final norm and head on the last (a copy of the tied
    embedding when the head is on another stage than the embedding)."""
    stages = pp * virtual_stages
    layers = chunk_layer_counts(model.layers, stages)[stage]
    block_matrices, block_vectors = block_tensor_sizes(model, tp)
    matrices, vectors = list(block_matrices) * layers, list(block_vectors) * layers
    if stage == 0:
        matrices.append(vocab_matrix_per_shard(model, tp))
        if model.position == "learned":
            matrices.append(model.seq_len * model.hidden)
    if stage == stages - 1:
        vectors += _norm_tensor_sizes(model)
        if not (model.tie_embeddings and stages == 1):
            matrices.append(vocab_matrix_per_shard(model, tp))
    return matrices, vectors


def whole_embedding_gradient_rows(model: ModelSpec, tp: int) -> int:
    """Rows of the token embedding's gradient a TP rank holds beyond its own ``1/tp``: the
    vocab-parallel embedding's gradient comes out of backward whole -- DTensor has no row-sharded
    strategy for ``embedding_dense_backward`` (its weight gradient is Partial or column-sharded,
    then redistributed to the rows). Measured by ``planc verify`` (torch 2.13, tp = 2) and
    ``planc verify --simulate`` (tp = 2, 4, 8)."""
    return model.padded_vocab - model.padded_vocab // tp if tp > 1 else 0


def embedding_params_per_shard(model: ModelSpec, tp: int) -> int:
    """Vocab-parallel token embedding (rows / tp) plus the replicated learned positions."""
    positions = model.seq_len * model.hidden if model.position == "learned" else 0
    return vocab_matrix_per_shard(model, tp) + positions


def head_params_per_shard(model: ModelSpec, tp: int, pp: int) -> int:
    """Final norm (replicated) and the vocab-parallel output head on the last stage.

    A tied head shares the embedding matrix when both sit on one stage (pp = 1); with pp > 1
    the last stage keeps a copy.
    """
    head = vocab_matrix_per_shard(model, tp)
    if model.tie_embeddings and pp == 1:
        head = 0
    return model.norm_params + head


@dataclass(frozen=True)
class StageParams:
    """What one pipeline rank holds, per TP shard."""

    rank: int
    """Pipeline rank (0 = first stage)."""
    layers: int
    """Transformer blocks on this rank (all its chunks)."""
    chunk_layers: tuple[int, ...]
    """Blocks of each of its ``v`` chunks."""
    embedding: bool
    """Holds the token embedding (stage 0: rank 0)."""
    head: bool
    """Holds the final norm, output head and loss (the last stage: rank pp - 1, or rank 0 under ZBV)."""
    params: int
    """Parameters on one device of this rank (after TP sharding)."""
    layer_params: int
    """Parameters of one block on one device."""
    largest_unit: int
    """Largest single module (block, embedding or head) on one device: the unit FSDP gathers."""


@lru_cache(maxsize=4096)
def stage_params(
    model: ModelSpec, tp: int, pp: int, virtual_stages: int, rank: int, style: StageStyle = "looped"
) -> StageParams:
    """Parameters held by pipeline rank ``rank`` on one of its TP devices."""
    counts = chunk_layer_counts(model.layers, pp * virtual_stages)
    chunks = tuple(counts[s] for s in stages_of_rank(rank, pp, virtual_stages, style))
    layers = sum(chunks)
    per_layer = layer_params_per_shard(model, tp)
    params = layers * per_layer
    units = [per_layer]
    first = holds_embedding(rank, pp, virtual_stages, style)
    last = holds_head(rank, pp, virtual_stages, style)
    if first:
        embedding = embedding_params_per_shard(model, tp)
        params += embedding
        units.append(embedding)
    if last:
        head = head_params_per_shard(model, tp, pp)
        params += head
        units.append(head)
    return StageParams(
        rank=rank,
        layers=layers,
        chunk_layers=chunks,
        embedding=first,
        head=last,
        params=params,
        layer_params=per_layer,
        largest_unit=max(units),
    )


def first_chunks_params(model: ModelSpec, tp: int, st: StageParams, k: int) -> int:
    """Parameters on one device of the first ``k`` of the chunks (stages) pipeline rank ``st``
    holds, in the looped order: their blocks, and the token embedding where the rank holds it
    (the model's first stage is its first chunk). The head is in the rank's last chunk."""
    if k <= 0:
        return 0
    if k >= len(st.chunk_layers):  # every chunk, the head's (in the last) included
        return st.params
    embedding = embedding_params_per_shard(model, tp) if st.embedding else 0
    return sum(st.chunk_layers[:k]) * st.layer_params + embedding
