"""``model from "config.json"``: read a Hugging Face ``config.json`` into model keys.

Supported ``model_type`` values: llama, mistral (and qwen2, which shares their layout), gpt2,
gpt_neox. Features planc's reference transformer does not build are approximated and listed in
the returned notes, so `planc check` can tell the user (e.g. GPT-NeoX's parallel residual).
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from planc.spec import strict_json


class HFConfigError(ValueError):
    """A config.json planc cannot read; the message says what is wrong and what to do."""


#: Hugging Face config.json files are a few kilobytes; refuse to read anything far larger.
MAX_CONFIG_BYTES = 1 << 20

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "gpt2", "gpt_neox")


def load_config_json(path: Path) -> dict[str, Any]:
    """The JSON object of a config.json, read with bounds (what any Hugging Face config must be)."""
    try:
        info = path.stat()
        if stat.S_ISREG(info.st_mode) and info.st_size <= MAX_CONFIG_BYTES:
            with path.open("rb") as handle:  # bounded: a config.json is a few kilobytes
                text = handle.read(MAX_CONFIG_BYTES + 1).decode("utf-8")
    except FileNotFoundError:
        raise HFConfigError(f"config file not found: {path}") from None
    except (OSError, ValueError) as exc:  # also UnicodeDecodeError, and a NUL byte in the path
        raise HFConfigError(f"cannot read {path}: {exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise HFConfigError(f"{path} is not a regular file")
    if info.st_size > MAX_CONFIG_BYTES or len(text) > MAX_CONFIG_BYTES:
        raise HFConfigError(f"{path} is too large for a config.json (over {MAX_CONFIG_BYTES:,} bytes)")
    try:
        config = strict_json.loads(text)
    except json.JSONDecodeError as exc:
        raise HFConfigError(f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except ValueError as exc:  # from the three number readers
        raise HFConfigError(f"{path}: {exc}") from None
    except RecursionError:
        raise HFConfigError(f"{path} is nested too deeply to be a config.json") from None
    if not isinstance(config, dict):
        raise HFConfigError(f"{path} must hold a JSON object, as a Hugging Face config.json does")
    return config


def read_hf_config(path: Path) -> tuple[dict[str, Any], list[str]]:
    """Return (model keys, notes) for the Hugging Face config at ``path``."""
    config = load_config_json(path)
    model_type = config.get("model_type")
    reader = _READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is None:
        raise HFConfigError(
            f"{path}: model_type {model_type!r} is not supported; planc reads "
            + ", ".join(SUPPORTED_MODEL_TYPES)
            + " (write the model block by hand for other architectures)"
        )
    notes: list[str] = []
    try:
        keys = reader(config, notes)
    except KeyError as exc:
        raise HFConfigError(f"{path}: a {model_type} config needs the key {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:  # e.g. "rope_theta": "fast"
        raise HFConfigError(f"{path}: a value has the wrong type ({exc})") from None
    keys = {k: v for k, v in keys.items() if v is not None}
    for key, value in keys.items():
        if isinstance(value, float) and key not in ("rope_theta", "norm_eps") and value.is_integer():
            keys[key] = int(value)
    name = config.get("_name_or_path") or path.parent.name or path.stem
    keys.setdefault("name", str(name))
    return keys, [f"{path.name}: {note}" for note in notes]


def rope_settings(config: dict, default_fraction: float = 1.0) -> tuple[float, str | None, float]:
    """(theta, RoPE type, fraction of each head rotated) as transformers 4.x (``rope_theta``,
    ``rope_scaling``, ``rotary_pct``, ``rotary_emb_base``) or 5.x (``rope_parameters``) write them."""
    params = config.get("rope_parameters")
    params = params if isinstance(params, dict) else {}
    scaling = config.get("rope_scaling")
    scaling = scaling if isinstance(scaling, dict) else {}
    theta = params.get("rope_theta", config.get("rope_theta", config.get("rotary_emb_base", 10000.0)))
    rope_type = params.get("rope_type", scaling.get("rope_type", scaling.get("type")))
    fraction = params.get("partial_rotary_factor", config.get("rotary_pct", default_fraction))
    return float(theta), rope_type, float(fraction)


def _llama(config: dict, notes: list[str]) -> dict:
    act = config.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        notes.append(f"hidden_act {act!r} is built as SwiGLU (silu)")
    window, context = config.get("sliding_window"), config.get("max_position_embeddings", 4096)
    # Qwen2 configs carry a sliding_window but switch it off with use_sliding_window = false; a
    # window as long as the context is full attention anyway.
    if (
        window
        and config.get("use_sliding_window", True) is not False
        and not (isinstance(window, int) and isinstance(context, int) and window >= context)
    ):
        notes.append(f"sliding-window attention ({window} tokens) is built as full causal attention")
    theta, rope_type, _ = rope_settings(config)
    if rope_type not in (None, "default"):
        notes.append(f"RoPE type {rope_type!r} is built as plain RoPE")
    bias = bool(config.get("attention_bias", False) or config.get("mlp_bias", False))
    qwen2 = config.get("model_type") == "qwen2"  # biases on q, k and v only, always
    return dict(
        layers=config["num_hidden_layers"],
        hidden=config["hidden_size"],
        heads=config["num_attention_heads"],
        # absent or null: one KV head per query head (multi-head attention); 0 is an error, not MHA
        kv_heads=config["num_attention_heads"]
        if config.get("num_key_value_heads") is None
        else config["num_key_value_heads"],
        ffn=config["intermediate_size"],
        vocab=config["vocab_size"],
        seq_len=config.get("max_position_embeddings", 4096),
        mlp="swiglu",
        norm="rmsnorm",
        position="rope",
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        bias=bias and not qwen2,
        qkv_bias=qwen2,
        rope_theta=theta,
        norm_eps=float(config.get("rms_norm_eps", 1e-6)),
    )


def _gpt2(config: dict, notes: list[str]) -> dict:
    hidden = config["n_embd"]
    return dict(
        layers=config["n_layer"],
        hidden=hidden,
        heads=config["n_head"],
        ffn=config.get("n_inner") or 4 * hidden,
        vocab=config["vocab_size"],
        seq_len=config.get("n_positions", config.get("n_ctx", 1024)),
        mlp="gelu",
        norm="layernorm",
        position="learned",
        tie_embeddings=bool(config.get("tie_word_embeddings", True)),
        bias=True,
        norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
    )


def _gpt_neox(config: dict, notes: list[str]) -> dict:
    if config.get("use_parallel_residual", True):
        notes.append("GPT-NeoX's parallel residual is built as a sequential pre-norm block (same parameters and FLOPs)")
    # transformers' GPTNeoXConfig rotates a quarter of each head unless told otherwise (rotary_pct = 0.25)
    theta, _, fraction = rope_settings(config, default_fraction=0.25)
    if fraction != 1.0:
        notes.append(f"rotary embeddings on {fraction:g} of each head are built as full-width RoPE")
    if config.get("hidden_act", "gelu") not in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        notes.append(f"hidden_act {config.get('hidden_act', 'gelu')!r} is built as the tanh approximation of GELU")
    return dict(
        layers=config["num_hidden_layers"],
        hidden=config["hidden_size"],
        heads=config["num_attention_heads"],
        ffn=config.get("intermediate_size") or 4 * config["hidden_size"],
        vocab=config["vocab_size"],
        seq_len=config.get("max_position_embeddings", 2048),
        mlp="gelu",
        norm="layernorm",
        position="rope",
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        bias=bool(config.get("attention_bias", True)),
        rope_theta=theta,
        norm_eps=float(config.get("layer_norm_eps", 1e-5)),
    )


_READERS = {"llama": _llama, "mistral": _llama, "qwen2": _llama, "gpt2": _gpt2, "gpt_neox": _gpt_neox}
