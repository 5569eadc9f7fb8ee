"""Which Hugging Face tensor holds each parameter of planc's model, and how its rows are laid out.

Three Hugging Face architectures compute exactly what planc's transformer computes:

============  =====================================  ==================================================
family        planc model                            Hugging Face classes
============  =====================================  ==================================================
``llama``     swiglu, rmsnorm, rope (GQA allowed)    LlamaForCausalLM; Qwen2ForCausalLM with qkv_bias
``gpt2``      gelu, layernorm, learned positions     GPT2LMHeadModel
``gpt_neox``  gelu, layernorm, rope                  GPTNeoXForCausalLM (sequential residual)
============  =====================================  ==================================================

Four layout differences are converted here, never guessed at load time:

* **RoPE.** planc rotates interleaved feature pairs ``(x[2i], x[2i+1])`` of each head (Meta's
  Llama, RoFormer Eq. 34); Hugging Face's ``rotate_half`` rotates ``(x[i], x[i + d/2])`` with the
  same angle ``theta^(-2i/d)``. Both rotate the rows of the query and key projections, so
  converting permutes those rows within each head: planc row ``2i + c`` (c = 0, 1) is Hugging Face
  row ``c * d/2 + i`` -- the inverse of the ``permute`` in transformers'
  ``convert_llama_weights_to_hf.py``. Values and the other projections are not permuted.
* **GPT-2's Conv1D** stores weights as ``[in, out]``: transposed. ``c_attn`` fuses Q, K, V along
  ``out`` (Q columns ``0..h-1``, then K, then V).
* **GPT-NeoX's ``query_key_value``** fuses Q, K, V *per head*: rows ``[q_0 k_0 v_0 q_1 k_1 v_1 ...]``
  (the module views its output as ``[heads, 3 * head_dim]``), each ``q_j``/``k_j`` in rotate-half order.
* **Vocabulary padding.** planc's embedding and output have ``padded_vocab`` rows; Hugging Face's
  ``vocab`` rows. Padding rows have no source (they load as zeros; the loss masks them).

A :class:`RowMap` says, for every row of a planc tensor, which row of the Hugging Face tensor (or
column, when transposed) holds it -- so a rank that owns rows ``a..b`` of a parameter reads only
the Hugging Face rows those map to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from planc.spec.model import ModelSpec

Family = Literal["llama", "gpt2", "gpt_neox"]

#: ``model_type`` of a config.json -> the family whose tensor names it uses.
MODEL_TYPE_FAMILY: dict[str, Family] = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "gpt2": "gpt2",
    "gpt_neox": "gpt_neox",
}

#: The prefix of the base model's tensors (checkpoints saved without it load too).
BASE_PREFIX: dict[Family, str] = {"llama": "model.", "gpt2": "transformer.", "gpt_neox": "gpt_neox."}

#: Tensors some checkpoints carry that are buffers, not weights (causal masks, RoPE frequencies).
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".attention.bias", ".attention.masked_bias", "inv_freq")


class UnsupportedFamily(ValueError):
    """No Hugging Face architecture computes this model exactly; the message says why."""


def family_for_spec(spec: ModelSpec) -> Family:
    """The Hugging Face family an export of ``spec`` is written as."""
    if spec.mlp == "swiglu" and spec.norm == "rmsnorm" and spec.position == "rope":
        return "llama"
    if spec.mlp == "gelu" and spec.norm == "layernorm" and spec.kv_heads == spec.heads:
        return "gpt2" if spec.position == "learned" else "gpt_neox"
    shape = f"mlp = {spec.mlp}, norm = {spec.norm}, position = {spec.position}"
    shape += f", kv_heads = {spec.kv_heads} of heads = {spec.heads}"
    raise UnsupportedFamily(
        f"no Hugging Face architecture planc exports computes this model exactly ({shape}); "
        "planc exports swiglu + rmsnorm + rope as Llama, and gelu + layernorm with full multi-head "
        "attention as GPT-2 (learned positions) or GPT-NeoX (rope). Use --format torch for any model"
    )


@dataclass(frozen=True)
class RowMap:
    """Row ``r`` of a planc tensor lives in row :meth:`hf_row` of its Hugging Face tensor.

    With ``head_dim``, rows come in heads of that size: head ``r // head_dim`` starts at
    ``offset + head * head_stride``, and within it ``rope`` converts planc's interleaved pairs to
    rotate-half order. Without, row ``r`` is ``offset + r``. Rows from ``valid_rows`` on are
    padding, with no source.
    """

    offset: int = 0
    head_dim: int | None = None
    head_stride: int | None = None
    rope: bool = False
    valid_rows: int | None = None

    def hf_row(self, row: int) -> int | None:
        if self.valid_rows is not None and row >= self.valid_rows:
            return None
        if self.head_dim is None:
            return self.offset + row
        head, j = divmod(row, self.head_dim)
        if self.rope:
            half = self.head_dim // 2
            j = (j % 2) * half + j // 2  # planc 2i + c -> Hugging Face c * d/2 + i
        return self.offset + head * (self.head_stride or self.head_dim) + j

    def hf_rows(self, start: int, stop: int) -> list[int | None]:
        return [self.hf_row(r) for r in range(start, stop)]


@dataclass(frozen=True)
class TensorSource:
    """Where one planc parameter's values are: a Hugging Face tensor, a row map, maybe transposed.

    Not transposed: ``planc[r, ...] = hf[rows.hf_row(r), ...]``. Transposed (GPT-2's Conv1D):
    ``planc[r, c] = hf[c, rows.hf_row(r)]``.
    """

    hf_name: str
    rows: RowMap = RowMap()
    transpose: bool = False


def _attention_sources(spec: ModelSpec, family: Family, p: str) -> dict[str, TensorSource]:
    """Sources of ``attention.wq/wk/wv/wo`` (weights and, with biases, biases) of one block."""
    d, h, kv = spec.head_dim, spec.hidden, spec.kv_dim
    rope = spec.position == "rope"
    if family == "llama":
        fused = {
            "wq": TensorSource(f"{p}self_attn.q_proj", RowMap(head_dim=d, rope=rope)),
            "wk": TensorSource(f"{p}self_attn.k_proj", RowMap(head_dim=d, rope=rope)),
            "wv": TensorSource(f"{p}self_attn.v_proj"),
            "wo": TensorSource(f"{p}self_attn.o_proj"),
        }
    elif family == "gpt2":
        fused = {
            "wq": TensorSource(f"{p}attn.c_attn", RowMap(offset=0), transpose=True),
            "wk": TensorSource(f"{p}attn.c_attn", RowMap(offset=h), transpose=True),
            "wv": TensorSource(f"{p}attn.c_attn", RowMap(offset=h + kv), transpose=True),
            "wo": TensorSource(f"{p}attn.c_proj", transpose=True),
        }
    else:
        qkv = f"{p}attention.query_key_value"
        fused = {
            "wq": TensorSource(qkv, RowMap(offset=0, head_dim=d, head_stride=3 * d, rope=rope)),
            "wk": TensorSource(qkv, RowMap(offset=d, head_dim=d, head_stride=3 * d, rope=rope)),
            "wv": TensorSource(qkv, RowMap(offset=2 * d, head_dim=d, head_stride=3 * d)),
            "wo": TensorSource(f"{p}attention.dense"),
        }
    return fused


_BLOCK_NAMES: dict[Family, dict[str, str]] = {
    "llama": {
        "attention_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "feed_forward.w1": "mlp.gate_proj",
        "feed_forward.w3": "mlp.up_proj",
        "feed_forward.w2": "mlp.down_proj",
    },
    "gpt2": {
        "attention_norm": "ln_1",
        "ffn_norm": "ln_2",
        "feed_forward.w1": "mlp.c_fc",
        "feed_forward.w2": "mlp.c_proj",
    },
    "gpt_neox": {
        "attention_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "feed_forward.w1": "mlp.dense_h_to_4h",
        "feed_forward.w2": "mlp.dense_4h_to_h",
    },
}

_TOP_NAMES: dict[Family, dict[str, str]] = {
    "llama": {"tok_embeddings": "model.embed_tokens", "norm": "model.norm", "output": "lm_head"},
    "gpt2": {
        "tok_embeddings": "transformer.wte",
        "pos_embeddings": "transformer.wpe",
        "norm": "transformer.ln_f",
        "output": "lm_head",
    },
    "gpt_neox": {"tok_embeddings": "gpt_neox.embed_in", "norm": "gpt_neox.final_layer_norm", "output": "embed_out"},
}

_BLOCK_PREFIX: dict[Family, str] = {
    "llama": "model.layers.{i}.",
    "gpt2": "transformer.h.{i}.",
    "gpt_neox": "gpt_neox.layers.{i}.",
}


def tensor_sources(spec: ModelSpec, family: Family) -> dict[str, TensorSource]:
    """Every parameter of planc's full model (names as in ``Transformer.named_parameters``, the tied
    output under ``output.weight`` as well) -> its :class:`TensorSource` in ``family``'s naming."""
    sources: dict[str, TensorSource] = {}
    top = _TOP_NAMES[family]
    vocab_rows = RowMap(valid_rows=spec.vocab)
    transposed = family == "gpt2"
    sources["tok_embeddings.weight"] = TensorSource(f"{top['tok_embeddings']}.weight", vocab_rows)
    if spec.position == "learned":
        sources["pos_embeddings.weight"] = TensorSource(f"{top['pos_embeddings']}.weight")
    output = top["tok_embeddings"] if spec.tie_embeddings else top["output"]
    sources["output.weight"] = TensorSource(f"{output}.weight", vocab_rows)
    norm_leaves = ("weight", "bias") if spec.norm == "layernorm" and spec.bias else ("weight",)
    for leaf in norm_leaves:
        sources[f"norm.{leaf}"] = TensorSource(f"{top['norm']}.{leaf}")
    linear_leaves = ("weight", "bias") if spec.bias else ("weight",)
    for i in range(spec.layers):
        p = _BLOCK_PREFIX[family].format(i=i)
        for planc_name, hf_name in _BLOCK_NAMES[family].items():
            if planc_name.endswith("norm"):
                for leaf in norm_leaves:
                    sources[f"layers.{i}.{planc_name}.{leaf}"] = TensorSource(f"{p}{hf_name}.{leaf}")
            elif planc_name != "feed_forward.w3" or spec.mlp == "swiglu":
                for leaf in linear_leaves:
                    # a bias is a 1-D tensor along the output rows: never transposed
                    sources[f"layers.{i}.{planc_name}.{leaf}"] = TensorSource(
                        f"{p}{hf_name}.{leaf}", transpose=transposed and leaf == "weight"
                    )
        for proj, source in _attention_sources(spec, family, p).items():
            qkv_only = spec.qkv_bias and proj != "wo"  # Qwen2: biases on q, k, v only
            for leaf in ("weight", "bias") if qkv_only else linear_leaves:
                sources[f"layers.{i}.attention.{proj}.{leaf}"] = TensorSource(
                    f"{source.hf_name}.{leaf}", source.rows, source.transpose and leaf == "weight"
                )
    return sources


def hf_shapes(spec: ModelSpec, family: Family) -> dict[str, tuple[int, ...]]:
    """Every tensor of the Hugging Face model that computes ``spec``, with its shape.

    Includes the biases the family always has (GPT-2's, GPT-NeoX's MLP and LayerNorm biases, Qwen2
    would be the same) even where planc's model has none: an export writes them as zeros, which
    computes the same function. A tied output has no tensor of its own.
    """
    h, f, v, d = spec.hidden, spec.ffn, spec.vocab, spec.head_dim
    q, kv = spec.heads * d, spec.kv_dim
    top = _TOP_NAMES[family]
    shapes: dict[str, tuple[int, ...]] = {f"{top['tok_embeddings']}.weight": (v, h)}
    if spec.position == "learned":
        shapes[f"{top['pos_embeddings']}.weight"] = (spec.seq_len, h)
    if not spec.tie_embeddings:
        shapes[f"{top['output']}.weight"] = (v, h)
    norm_leaves = ("weight",) if family == "llama" else ("weight", "bias")
    for leaf in norm_leaves:
        shapes[f"{top['norm']}.{leaf}"] = (h,)
    biased = spec.bias or family != "llama"
    names = _BLOCK_NAMES[family]
    for i in range(spec.layers):
        p = _BLOCK_PREFIX[family].format(i=i)
        for norm in ("attention_norm", "ffn_norm"):
            for leaf in norm_leaves:
                shapes[f"{p}{names[norm]}.{leaf}"] = (h,)
        if family == "llama":
            linears = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h)}
            linears |= {"self_attn.o_proj": (h, q), "mlp.gate_proj": (f, h), "mlp.up_proj": (f, h)}
            linears["mlp.down_proj"] = (h, f)
        elif family == "gpt2":  # Conv1D: [in, out]
            linears = {"attn.c_attn": (h, q + 2 * kv), "attn.c_proj": (q, h), "mlp.c_fc": (h, f), "mlp.c_proj": (f, h)}
        else:
            linears = {"attention.query_key_value": (3 * q, h), "attention.dense": (h, q)}
            linears |= {"mlp.dense_h_to_4h": (f, h), "mlp.dense_4h_to_h": (h, f)}
        for name, shape in linears.items():
            shapes[f"{p}{name}.weight"] = shape
            qwen2_bias = spec.qkv_bias and not spec.bias and name.endswith(("q_proj", "k_proj", "v_proj"))
            if biased or qwen2_bias:
                shapes[f"{p}{name}.bias"] = (shape[1],) if family == "gpt2" else (shape[0],)
    return shapes
