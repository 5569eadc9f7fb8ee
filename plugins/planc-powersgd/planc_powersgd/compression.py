"""How much PowerSGD shrinks a model's data-parallel gradient traffic (pure arithmetic, no torch).

PowerSGD (Vogels et al. 2019, Algorithm 1) replaces the all-reduce of an n x m gradient matrix
by the all-reduces of two factors, P (n x r) and Q (m x r): (n + m) r elements instead of n m.
PyTorch's hook (``powerSGD_hook``) views every gradient as ``tensor.view(shape[0], -1)``, uses
rank min(n, m, r), compresses a matrix only when ``(n + m) r * min_compression_rate < n m``, and
all-reduces 1-D tensors (biases, norm gains) and incompressible matrices as they are.
"""

from __future__ import annotations


def matrix_elements(rows: int, cols: int, rank: int, min_compression_rate: float) -> tuple[int, int]:
    """(elements sent without compression, with PowerSGD) for one ``rows x cols`` gradient."""
    full = rows * cols
    r = min(rows, cols, rank)
    compressed = (rows + cols) * r
    return full, (compressed if compressed * min_compression_rate < full else full)


def gradient_shapes(model, tp: int) -> list[tuple[int, ...]]:
    """Shapes of every gradient of one pipeline-free replica, as one tensor-parallel rank holds them.

    ``model`` is a :class:`planc.spec.ModelSpec`. Column-parallel weights (wq, wk, wv, w1, w3, the
    vocabulary-parallel embedding and output) split their rows by ``tp``; row-parallel ones (wo,
    w2) their columns; norms and row-parallel biases are replicated.
    """
    h, f, kv, v = model.hidden, model.ffn, model.kv_dim, model.padded_vocab
    shapes: list[tuple[int, ...]] = [(v // tp, h)]  # token embedding
    if model.position == "learned":
        shapes.append((model.seq_len, h))
    norm = [(h,), (h,)] if model.norm == "layernorm" and model.bias else [(h,)]
    block = [*norm, (h // tp, h), (kv // tp, h), (kv // tp, h), (h, h // tp), *norm, (f // tp, h), (h, f // tp)]
    if model.mlp == "swiglu":
        block.append((f // tp, h))
    if model.bias:
        block += [(h // tp,), (kv // tp,), (kv // tp,), (h,), (f // tp,), (h,)] + (
            [(f // tp,)] if model.mlp == "swiglu" else []
        )
    shapes += block * model.layers
    shapes += norm
    if not model.tie_embeddings:
        shapes.append((v // tp, h))
    return shapes


def traffic_ratio(model, tp: int, rank: int, min_compression_rate: float = 2.0) -> float:
    """PowerSGD's gradient elements over plain all-reduce's, for the whole model (<= 1)."""
    full = compressed = 0
    for shape in gradient_shapes(model, tp):
        if len(shape) == 1:
            full += shape[0]
            compressed += shape[0]
            continue
        plain, small = matrix_elements(shape[0], shape[1], rank, min_compression_rate)
        full += plain
        compressed += small
    return compressed / full


def compressed_matrices(model, tp: int, rank: int, min_compression_rate: float = 2.0) -> int:
    """How many of the model's gradients the hook compresses (the matrices worth it)."""
    count = 0
    for shape in gradient_shapes(model, tp):
        if len(shape) == 2:
            full, small = matrix_elements(shape[0], shape[1], rank, min_compression_rate)
            count += small < full
    return count
