"""FLOPs per step, in the form of Narayanan et al. 2021, Eq. 3.

For a GPT with h hidden, l layers, s sequence length, V vocabulary and B sequences per step,
Narayanan et al. count (Sec. 5.1, Eq. 3, with activation recomputation)

    F = 96 B s l h^2 (1 + s / (6h) + V / (16 l h))

= 4 passes (forward, recomputed forward, backward = 2 x forward) of 24 B s l h^2 GEMM FLOPs,
plus 4 B s^2 l h per pass for the attention scores and the attention over values, plus the
logits 2 B s h V per pass counted 3 times (the head is not recomputed). 24 h^2 is 2 FLOPs per
multiply-add times the 12 h^2 weights of a block. We write the same thing for any block:

- per token and block, forward: 2 x (matrix weights of the block) + 4 s h_q
  (h_q = heads x head_dim = h; GQA does not change the score FLOPs);
- per token, head: 2 h V;
- training = 3 x forward (Kaplan et al. 2020: backward is twice the forward);
- **model FLOPs** (for MFU, Chowdhery et al. 2022, App. B): no recomputation;
- **hardware FLOPs**: plus one more forward of every block under full recomputation (the head
  is not recomputed). Selective recomputation with fused attention (planc's policy) reruns one
  GEMM, the attention-out projection: 2 h h_q per token and block; with materialized attention
  (Korthikanti et al. 2022) it reruns the scores and the attention over values: 4 s h_q.

Causal attention is counted at full s^2, as both papers do, even though fused kernels skip the
masked half (the time model, not the FLOP count, takes that into account).
"""

from __future__ import annotations

from planc.spec.model import ModelSpec


def block_matrix_weights(model: ModelSpec) -> int:
    """Weights of one block that take part in GEMMs (no biases, no norms)."""
    h, f, kv = model.hidden, model.ffn, model.kv_dim
    matrices = 2 if model.mlp == "gelu" else 3
    return 2 * h * h + 2 * h * kv + matrices * h * f


def forward_flops_per_token(model: ModelSpec) -> tuple[float, float, float]:
    """Forward FLOPs per token: (per block GEMMs, per block attention, head).

    Attention is 4 s h: the scores Q K^T (2 s h) and the weighted sum over values (2 s h).
    """
    gemm = 2.0 * block_matrix_weights(model)
    attention = 4.0 * model.seq_len * model.heads * model.head_dim
    head = 2.0 * model.hidden * model.padded_vocab
    return gemm, attention, head


def model_flops_per_token(model: ModelSpec) -> float:
    """Training FLOPs per token without recomputation (3 x forward): the 'model FLOPs'."""
    gemm, attention, head = forward_flops_per_token(model)
    return 3.0 * (model.layers * (gemm + attention) + head)


def model_flops_per_step(model: ModelSpec, tokens: int) -> float:
    """Model FLOPs of one optimizer step over ``tokens`` tokens (Narayanan Eq. 3 without the
    recompute pass: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) for their GPT)."""
    return model_flops_per_token(model) * tokens


def hardware_flops_per_step(model: ModelSpec, tokens: int, recompute: str, attention: str = "flash") -> float:
    """FLOPs the devices execute per step: model FLOPs plus what recomputation reruns.

    For Narayanan's GPT under full recomputation this is exactly their Eq. 3:
    96 B s l h^2 (1 + s/(6h) + V/(16 l h)). ``attention`` is the runtime profile's kernel
    (``flash`` or ``materialized``), which decides what selective recomputation reruns.
    """
    flops = model_flops_per_step(model, tokens)
    gemm, scores, _ = forward_flops_per_token(model)
    if recompute == "full":
        flops += model.layers * (gemm + scores) * tokens
    elif recompute == "selective":
        rerun = scores if attention == "materialized" else 2.0 * model.hidden * model.heads * model.head_dim
        flops += model.layers * rerun * tokens
    return flops


def narayanan_eq3(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021, Eq. 3 verbatim: F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))."""
    B, s, l, h, V = batch, seq, layers, hidden, vocab
    return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
