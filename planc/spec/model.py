"""The ``model`` block: the architecture of the decoder-only transformer planc builds."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, computed_field, model_validator

from planc.spec.fields import Flag, PositiveInt, SpecModel

#: Llama's SwiGLU rule rounds 2/3 of 4h up to a multiple of this (Touvron et al. 2023, model.py).
SWIGLU_MULTIPLE_OF = 256


def default_ffn(hidden: int, mlp: str) -> int:
    """The MLP width a plan gets when it does not set ``ffn``.

    GELU: 4h (Vaswani et al. 2017; GPT-2). SwiGLU: 2/3 of 4h, so the three matrices cost what
    two 4h matrices would (Shazeer 2020), rounded up to a multiple of 256 as Llama does
    (4096 -> 11008).
    """
    if mlp == "gelu":
        return 4 * hidden
    width = int(2 * 4 * hidden / 3)
    return SWIGLU_MULTIPLE_OF * math.ceil(width / SWIGLU_MULTIPLE_OF)


class ModelSpec(SpecModel):
    """The decoder-only transformer to train; the runtime builds exactly this."""

    name: str | None = None
    """A display name, e.g. "llama3-8b" (optional; set by presets)."""
    layers: PositiveInt
    """Number of transformer blocks."""
    hidden: PositiveInt
    """Model width h (embedding size)."""
    heads: PositiveInt
    """Number of attention (query) heads; must divide hidden."""
    kv_heads: PositiveInt
    """Number of key/value heads (default: heads). Fewer than heads is grouped-query attention."""
    ffn: PositiveInt
    """MLP inner width (default: 4h for gelu; 8h/3 rounded up to a multiple of 256 for swiglu)."""
    vocab: PositiveInt
    """Vocabulary size of the tokenizer."""
    seq_len: PositiveInt
    """Sequence length in tokens (every training sequence has exactly this length)."""
    mlp: Literal["gelu", "swiglu"] = "gelu"
    """MLP kind: gelu (two matrices, GPT) or swiglu (three matrices, Llama)."""
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    """Normalisation: layernorm (GPT) or rmsnorm (Llama). Pre-norm in both cases."""
    position: Literal["learned", "rope"] = "learned"
    """Position encoding: learned absolute embeddings (GPT) or rotary (RoPE, Llama)."""
    tie_embeddings: Flag = False
    """Share the input embedding with the output projection (GPT-2)."""
    bias: Flag
    """Biases in linear layers and LayerNorm (default: true for gelu models, false for swiglu)."""
    qkv_bias: Flag = False
    """Biases on the query, key and value projections only, as Qwen2 has them (bias = true covers them too)."""
    rope_theta: float = Field(default=10000.0, gt=0)
    """RoPE base frequency (Llama 2: 10000; Llama 3: 500000). Used when position = rope."""
    norm_eps: float = Field(default=1e-5, gt=0)
    """Epsilon of the normalisation layers."""
    vocab_multiple: PositiveInt = 128
    """Pad the embedding and output to a multiple of this many rows, so vocabulary-parallel
    shards are equal and GEMMs aligned (Megatron's make-vocab-size-divisible-by; 50257 -> 50304)."""
    init: Literal["random", "pretrained"] = "random"
    """Starting weights: random (seeded; the same for every layout) or pretrained (the Hugging Face
    safetensors in the weights directory; see docs/weights.md)."""
    weights: str | None = None
    """Directory of the Hugging Face model (config.json + safetensors) that init = pretrained reads,
    relative to the .plan file (default: the directory of `from`)."""

    @model_validator(mode="before")
    @classmethod
    def _fill_defaults(cls, data: Any) -> Any:
        """Resolve defaults that depend on other keys, so every consumer sees plain ints."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("kv_heads") is None and "heads" in data:
            data["kv_heads"] = data["heads"]
        mlp = data.get("mlp", "gelu")
        if data.get("ffn") is None and isinstance(data.get("hidden"), int) and mlp in ("gelu", "swiglu"):
            data["ffn"] = default_ffn(data["hidden"], mlp)
        if data.get("bias") is None:
            data["bias"] = mlp == "gelu"
        for derived in ("head_dim", "padded_vocab", "params", "params_per_layer", "params_embedding"):
            data.pop(derived, None)  # accept plan.json, which carries computed fields
        return data

    # -- derived quantities ------------------------------------------------------------------

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form
    @property
    def head_dim(self) -> int:
        """Width of one attention head, hidden // heads."""
        return self.hidden // self.heads

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form
    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding and output matrices: vocab rounded up to vocab_multiple."""
        return self.vocab_multiple * math.ceil(self.vocab / self.vocab_multiple)

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: kv_heads * head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def norm_params(self) -> int:
        """Parameters of one normalisation layer (weight, plus bias for a biased LayerNorm)."""
        return self.hidden * (2 if self.norm == "layernorm" and self.bias else 1)

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form
    @property
    def params_per_layer(self) -> int:
        """Parameters of one transformer block: two norms, attention, MLP."""
        h, f, kv = self.hidden, self.ffn, self.kv_dim
        attention_bias = 2 * h + 2 * kv if self.bias else (h + 2 * kv if self.qkv_bias else 0)
        attention = 2 * h * h + 2 * h * kv + attention_bias
        matrices = 2 if self.mlp == "gelu" else 3
        mlp = matrices * h * f + (((matrices - 1) * f + h) if self.bias else 0)
        return 2 * self.norm_params + attention + mlp

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form
    @property
    def params_embedding(self) -> int:
        """Token embedding plus learned position embedding (if any)."""
        positions = self.seq_len * self.hidden if self.position == "learned" else 0
        return self.padded_vocab * self.hidden + positions

    @property
    def params_output(self) -> int:
        """Final norm plus the output projection (none of its own when tied)."""
        head = 0 if self.tie_embeddings else self.padded_vocab * self.hidden
        return self.norm_params + head

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form
    @property
    def params(self) -> int:
        """Exact parameter count of the model the runtime builds (tied weights counted once)."""
        return self.params_embedding + self.layers * self.params_per_layer + self.params_output
