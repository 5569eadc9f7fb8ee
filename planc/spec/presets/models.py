"""Model presets: architectures as published, so a plan can say ``preset = "llama3-8b"``.

Each entry sets only what the architecture defines; ``ffn``, ``kv_heads`` and ``bias`` fall back
to the defaults of :class:`planc.spec.model.ModelSpec` where the source does not differ.
"""

from __future__ import annotations

# GPT-2: Radford et al. 2019, Table 2, and the released configs (openai-community/gpt2*):
# vocab 50257 (padded by planc to a multiple of 128 = 50304, as Megatron and nanoGPT do),
# 1024 positions, learned positions, LayerNorm, GELU MLP with 4h, biases, tied embeddings.
_GPT2 = dict(
    vocab=50257, seq_len=1024, mlp="gelu", norm="layernorm", position="learned", tie_embeddings=True, bias=True
)

# Llama 2: Touvron et al. 2023 (arXiv 2307.09288) and the released config.json files:
# SwiGLU, RMSNorm (eps 1e-5), RoPE (theta 1e4), 4096 context, vocab 32000, untied, no biases.
_LLAMA2 = dict(
    vocab=32000,
    seq_len=4096,
    mlp="swiglu",
    norm="rmsnorm",
    position="rope",
    tie_embeddings=False,
    bias=False,
    rope_theta=10000.0,
    norm_eps=1e-5,
)

# Llama 3: Llama Team 2024, "The Llama 3 Herd of Models" (arXiv 2407.21783), Table 3, and the
# released configs: vocab 128256, GQA with 8 KV heads, RoPE theta 500000, 8192 context.
_LLAMA3 = dict(
    vocab=128256,
    seq_len=8192,
    mlp="swiglu",
    norm="rmsnorm",
    position="rope",
    tie_embeddings=False,
    bias=False,
    rope_theta=500000.0,
    norm_eps=1e-5,
)

MODEL_PRESETS: dict[str, dict] = {
    "gpt2": dict(_GPT2, layers=12, hidden=768, heads=12),
    "gpt2-small": dict(_GPT2, layers=12, hidden=768, heads=12),
    "gpt2-medium": dict(_GPT2, layers=24, hidden=1024, heads=16),
    "gpt2-large": dict(_GPT2, layers=36, hidden=1280, heads=20),
    "gpt2-xl": dict(_GPT2, layers=48, hidden=1600, heads=25),
    # GPT-3 175B: Brown et al. 2020 (arXiv 2005.14165), Table 2.1: 96 layers, d_model 12288,
    # 96 heads of 128, context 2048, the GPT-2 tokenizer; untied as in Megatron's GPT runs.
    "gpt3-175b": dict(_GPT2, layers=96, hidden=12288, heads=96, seq_len=2048, tie_embeddings=False),
    "llama2-7b": dict(_LLAMA2, layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008),
    "llama2-13b": dict(_LLAMA2, layers=40, hidden=5120, heads=40, kv_heads=40, ffn=13824),
    "llama2-70b": dict(_LLAMA2, layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672),
    "llama3-8b": dict(_LLAMA3, layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336),
    "llama3-70b": dict(_LLAMA3, layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672),
    "llama3-405b": dict(_LLAMA3, layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248),
    # Llama 3.1 8B, 70B and 405B: Llama 3's architectures (the paper's Table 3 is 3.1's) with the
    # context extended to 131072 by "llama3" RoPE scaling, built as plain RoPE; seq_len is the
    # 8192-token pre-training context, as torchtitan's llama3 configs train them.
    "llama3.1-8b": dict(_LLAMA3, layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336),
    "llama3.1-70b": dict(_LLAMA3, layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672),
    "llama3.1-405b": dict(_LLAMA3, layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248),
    # Llama 3.2 1B and 3B: the released configs (meta-llama/Llama-3.2-1B, -3B): Llama 3's vocabulary,
    # GQA with 8 KV heads and RoPE theta, tied embeddings, ffn 8192. Their "llama3" RoPE scaling
    # (factor 32, for 131072 positions after pre-training at 8192) is built as plain RoPE, as
    # planc.spec.hf_config reads it; seq_len is the pre-training context.
    "llama3.2-1b": dict(_LLAMA3, layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, tie_embeddings=True),
    "llama3.2-3b": dict(_LLAMA3, layers=28, hidden=3072, heads=24, kv_heads=8, ffn=8192, tie_embeddings=True),
    # Mistral 7B: Jiang et al. 2023 (arXiv 2310.06825), Table 1: 32 layers, dim 4096, 32 heads,
    # 8 KV heads, hidden_dim 14336, vocab 32000, 8192 context. Its 4096-token sliding window is
    # not modelled: planc trains full causal attention over seq_len.
    "mistral-7b": dict(_LLAMA2, layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq_len=8192),
}
