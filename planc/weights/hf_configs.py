"""Hugging Face ``config.json`` files: the one an export writes, and what a given one has that planc lacks.

:func:`config_for` writes the config under which transformers builds exactly planc's model
(:mod:`planc.weights.hf_names` says which family). :func:`differences` is the check behind
``init = pretrained``: every feature of a config that would make planc's model compute something
other than the Hugging Face model with the same weights -- an activation, a RoPE variant, a
parallel residual, biases planc does not build. Planning tolerates those (``planc check`` notes
them); starting from the weights does not, since the result would silently be a different model.

Both read and write the keys of transformers 4.x (``rope_theta``, ``rotary_pct``) and of 5.x
(``rope_parameters``), so exports load in either.
"""

from __future__ import annotations

from typing import Any

from planc.spec.hf_config import rope_settings
from planc.spec.model import ModelSpec
from planc.weights.hf_names import MODEL_TYPE_FAMILY, Family

#: Activations that are the tanh approximation of GELU planc computes (``F.gelu(approximate="tanh")``):
#: transformers' ``gelu_new`` and ``gelu_fast`` evaluate the same formula (Hendrycks & Gimpel 2016, Eq. 2).
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
SILU = ("silu", "swish")

_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16"}


def config_for(spec: ModelSpec, family: Family, dtype: str = "fp32") -> dict[str, Any]:
    """The ``config.json`` of ``spec`` exported as ``family`` with weights stored in ``dtype`` (fp32 | bf16)."""
    common = {
        "vocab_size": spec.vocab,
        "tie_word_embeddings": spec.tie_embeddings,
        "torch_dtype": _DTYPE_NAMES[dtype],
        "dtype": _DTYPE_NAMES[dtype],
        "initializer_range": 0.02,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": None,
    }
    if family == "gpt2":
        return {**_gpt2_config(spec), **common}
    rope = {"rope_type": "default", "rope_theta": spec.rope_theta}
    if family == "gpt_neox":
        return {**_neox_config(spec, rope), **common}
    return {**_llama_config(spec, rope), **common}


def _llama_config(spec: ModelSpec, rope: dict) -> dict[str, Any]:
    """LlamaForCausalLM; with biases on q, k and v only, Qwen2ForCausalLM (the same layout, no window)."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.seq_len,
        "rms_norm_eps": spec.norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_parameters": rope,
        "attention_dropout": 0.0,
    }
    if spec.qkv_bias and not spec.bias:
        qwen2 = {"use_sliding_window": False, "sliding_window": None, "max_window_layers": spec.layers}
        return {**config, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **qwen2}
    return {**config, "attention_bias": spec.bias, "mlp_bias": spec.bias}


def _gpt2_config(spec: ModelSpec) -> dict[str, Any]:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_embd": spec.hidden,
        "n_layer": spec.layers,
        "n_head": spec.heads,
        "n_inner": spec.ffn,
        "n_positions": spec.seq_len,
        "n_ctx": spec.seq_len,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": spec.norm_eps,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }


def _neox_config(spec: ModelSpec, rope: dict) -> dict[str, Any]:
    return {
        "architectures": ["GPTNeoXForCausalLM"],
        "model_type": "gpt_neox",
        "hidden_size": spec.hidden,
        "intermediate_size": spec.ffn,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "hidden_act": "gelu_pytorch_tanh",
        "max_position_embeddings": spec.seq_len,
        "layer_norm_eps": spec.norm_eps,
        "use_parallel_residual": False,
        "attention_bias": True,  # biases planc does not build are written as zeros
        "rotary_pct": 1.0,
        "rotary_emb_base": spec.rope_theta,
        "rope_theta": spec.rope_theta,
        "rope_parameters": {**rope, "partial_rotary_factor": 1.0},
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
    }


def differences(config: dict[str, Any], spec: ModelSpec) -> list[str]:
    """What the Hugging Face model of ``config`` computes differently from planc's model of ``spec``.

    Tensor shapes are checked against the weights themselves (:mod:`planc.weights.plan_checks`);
    this covers what shapes do not show. Empty: the same weights give the same function.
    """
    model_type = config.get("model_type")
    family = MODEL_TYPE_FAMILY.get(model_type) if isinstance(model_type, str) else None
    if family is None:
        return [f"model_type {model_type!r} is not one planc reads weights of ({', '.join(MODEL_TYPE_FAMILY)})"]
    found: list[str] = []
    _, rope_type, rotary_fraction = rope_settings(config, default_fraction=0.25 if family == "gpt_neox" else 1.0)
    if family != "gpt2":
        if rope_type not in (None, "default"):
            found.append(f"RoPE type {rope_type!r} (planc builds plain RoPE)")
        if rotary_fraction != 1.0:
            found.append(f"rotary embeddings on {rotary_fraction:g} of each head (planc rotates all of it)")
    tied = bool(config.get("tie_word_embeddings", family == "gpt2"))
    if tied != spec.tie_embeddings:
        plan_tie = str(spec.tie_embeddings).lower()
        found.append(f"tie_word_embeddings = {str(tied).lower()}, but the plan has tie_embeddings = {plan_tie}")
    found += _FAMILY_CHECKS[family](config, spec)
    return found


def _llama(config: dict[str, Any], spec: ModelSpec) -> list[str]:
    found = []
    act = config.get("hidden_act", "silu")
    if act not in SILU:
        found.append(f"hidden_act {act!r} (planc's SwiGLU uses silu)")
    window = config.get("sliding_window")
    if window and config.get("use_sliding_window", True) is not False and int(window) < spec.seq_len:
        found.append(
            f"sliding-window attention over {window} tokens, shorter than seq_len = {spec.seq_len} "
            f"(planc attends over the whole sequence; set seq_len <= {window} to make them equal)"
        )
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim != spec.head_dim:
        found.append(f"head_dim = {head_dim}, but hidden / heads = {spec.head_dim}")
    if config.get("model_type") == "qwen2":
        if spec.bias:
            found.append("Qwen2 has biases on q, k and v only, but the plan has bias = true (on every linear)")
        elif not spec.qkv_bias:
            found.append("Qwen2 has biases on q, k and v, but the plan has qkv_bias = false")
    elif spec.qkv_bias and not spec.bias:
        found.append("qkv_bias = true, but a Llama config's attention_bias covers o_proj too (q/k/v-only is Qwen2's)")
    else:
        attention_bias, mlp_bias = bool(config.get("attention_bias", False)), bool(config.get("mlp_bias", False))
        if attention_bias != mlp_bias:
            found.append("attention_bias and mlp_bias differ (planc's bias covers every linear)")
        elif attention_bias != spec.bias:
            found.append(f"linear biases = {str(attention_bias).lower()}, but the plan has bias = {spec.bias}")
    return found


def _gpt2(config: dict[str, Any], spec: ModelSpec) -> list[str]:
    found = []
    act = config.get("activation_function", "gelu_new")
    if act not in TANH_GELU:
        found.append(f"activation_function {act!r} (planc computes the tanh approximation of GELU)")
    if config.get("scale_attn_weights", True) is False:
        found.append("scale_attn_weights = false (planc scales attention scores by 1/sqrt(head_dim))")
    if config.get("scale_attn_by_inverse_layer_idx"):
        found.append("scale_attn_by_inverse_layer_idx = true (planc scales every layer alike)")
    if not spec.bias:
        found.append("GPT-2 has biases, but the plan has bias = false")
    if spec.position != "learned":
        found.append("GPT-2 learns its positions, but the plan has position = rope")
    return found


def _gpt_neox(config: dict[str, Any], spec: ModelSpec) -> list[str]:
    found = []
    act = config.get("hidden_act", "gelu")
    if act not in TANH_GELU:
        found.append(f"hidden_act {act!r} (planc computes the tanh approximation of GELU: gelu_pytorch_tanh)")
    if config.get("use_parallel_residual", True):
        found.append("use_parallel_residual = true (planc's blocks are sequential: x + attn(x), then + mlp(.))")
    if not spec.bias:
        found.append("GPT-NeoX has biases, but the plan has bias = false")
    elif config.get("attention_bias", True) is False:
        found.append("attention_bias = false but MLP biases (planc's bias covers every linear)")
    return found


_FAMILY_CHECKS = {"llama": _llama, "gpt2": _gpt2, "gpt_neox": _gpt_neox}
