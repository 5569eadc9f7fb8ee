"""``model from "config.json"``: Llama-, GPT-2- and GPT-NeoX-style configs become the ModelSpec
their numbers say. Expected fields are read off each config by hand (comments give the rule)."""

import json

import pytest

from planc.dsl import load_plan_text
from planc.strategies.registry import load_registry

REST = 'hardware { device = "A100-80GB" }\ntrain { global_batch = 8 }\n'

LLAMA = {  # a small Llama 2-style config, as transformers writes it
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 3000,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
GPT2 = {  # GPT-2 small's config.json (openai-community/gpt2), n_inner null = 4 * n_embd
    "model_type": "gpt2",
    "n_embd": 768,
    "n_head": 12,
    "n_layer": 12,
    "n_positions": 1024,
    "n_ctx": 1024,
    "vocab_size": 50257,
    "n_inner": None,
    "layer_norm_epsilon": 1e-5,
    "activation_function": "gelu_new",
}
NEOX = {  # a Pythia-style GPT-NeoX config
    "model_type": "gpt_neox",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "vocab_size": 50304,
    "max_position_embeddings": 2048,
    "rotary_pct": 0.25,
    "rotary_emb_base": 10000,
    "use_parallel_residual": True,
    "layer_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}


def load(tmp_path, config: dict, overrides: str = ""):
    folder = tmp_path / "configs" / "m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    body = f" {{ {overrides} }}" if overrides else ""
    text = f'model from "configs/m/config.json"{body}\n{REST}'
    return load_plan_text(text, str(tmp_path / "p.plan"), strategies=load_registry(), base_dir=tmp_path)


def test_llama_style(tmp_path):
    plan = load(tmp_path, LLAMA)
    m = plan.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn) == (6, 512, 8, 2, 1376)
    assert (m.vocab, m.seq_len) == (3000, 1024)  # vocab_size, max_position_embeddings
    assert (m.mlp, m.norm, m.position) == ("swiglu", "rmsnorm", "rope")
    assert m.bias is False and m.tie_embeddings is False
    assert m.rope_theta == 500000.0 and m.norm_eps == 1e-6
    assert m.padded_vocab == 3072  # 3000 rounded up to a multiple of 128
    assert m.head_dim == 64  # 512 / 8
    assert plan.notes == ()


def test_gpt2_style(tmp_path):
    m = load(tmp_path, GPT2).model
    assert (m.layers, m.hidden, m.heads, m.kv_heads) == (12, 768, 12, 12)  # kv_heads = heads
    assert m.ffn == 3072  # n_inner null -> 4 * 768
    assert (m.vocab, m.seq_len) == (50257, 1024)
    assert (m.mlp, m.norm, m.position) == ("gelu", "layernorm", "learned")
    assert m.bias is True and m.tie_embeddings is True  # GPT-2 ties the output to the embedding
    # GPT-2 small has 124,439,808 parameters; planc pads 50257 to 50304 rows: + 47 x 768.
    assert m.params == 124_439_808 + 47 * 768


def test_gpt_neox_style_and_its_notes(tmp_path):
    plan = load(tmp_path, NEOX)
    m = plan.model
    assert (m.layers, m.hidden, m.heads, m.ffn, m.vocab, m.seq_len) == (8, 1024, 16, 4096, 50304, 2048)
    assert (m.mlp, m.norm, m.position, m.bias) == ("gelu", "layernorm", "rope", True)
    assert m.rope_theta == 10000.0
    # What planc builds differently is said, not hidden:
    assert any("parallel residual" in note for note in plan.notes)
    assert any("rotary embeddings on 0.25 of each head" in note for note in plan.notes)


def test_overrides_after_from_win(tmp_path):
    m = load(tmp_path, LLAMA, "seq_len = 256  layers = 2").model
    assert (m.seq_len, m.layers, m.hidden) == (256, 2, 512)


def test_name_comes_from_the_folder(tmp_path):
    assert load(tmp_path, LLAMA).model.name == "m"


@pytest.mark.parametrize(
    "config,expected",
    [
        ({"model_type": "bert", "hidden_size": 8}, "model_type 'bert' is not supported"),
        ({"model_type": "llama", "hidden_size": 8}, "needs the key 'num_hidden_layers'"),
        ({**LLAMA, "rope_theta": "fast"}, "a value has the wrong type"),
        ({**LLAMA, "model_type": ["llama"]}, "is not supported"),
        ([1, 2], "must hold a JSON object"),
    ],
)
def test_bad_configs_are_located_errors(tmp_path, config, expected):
    from planc.errors import PlanError

    with pytest.raises(PlanError) as caught:
        load(tmp_path, config)
    text = str(caught.value)
    assert expected in text
    assert ":1:12: error:" in text  # at the path in `model from "..."`


@pytest.mark.parametrize(
    "raw,expected",
    [
        ('"hidden_size": 1e400', "the number 1e400 is out of range for a 64-bit float"),
        ('"rope_theta": NaN', "NaN is not a number"),
        ('"hidden_size": -Infinity', "-Infinity is not a number"),
        ('"hidden_size": 1' + "0" * 5000, "is out of range"),  # Python refuses int() of > 4300 digits
        ('"num_hidden_layers": 99999999999999999999', "is out of range"),
        ('"rope_theta": "inf"', "rope_theta must be a finite number, got inf"),
    ],
)
def test_numbers_a_config_cannot_mean_are_located_errors(tmp_path, raw, expected):
    from planc.errors import PlanError

    folder = tmp_path / "configs" / "m"
    folder.mkdir(parents=True)
    text = json.dumps(LLAMA)[:-1] + ", " + raw + "}"  # the raw key wins: JSON keeps the last duplicate
    (folder / "config.json").write_text(text)
    with pytest.raises(PlanError) as caught:
        load_plan_text(
            f'model from "configs/m/config.json"\n{REST}',
            str(tmp_path / "p.plan"),
            strategies=load_registry(),
            base_dir=tmp_path,
        )
    assert expected in str(caught.value)
    assert ":1:12: error:" in str(caught.value)


def test_sliding_window_is_noted_only_when_it_is_on_and_shorter_than_the_context(tmp_path):
    def notes(name, **extra):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**LLAMA, **extra}))
        plan = load_plan_text(
            f'model from "{name}/config.json"\n{REST}',
            str(tmp_path / "p.plan"),
            strategies=load_registry(),
            base_dir=tmp_path,
        )
        return [n for n in plan.notes if "sliding-window" in n]

    # Qwen2-7B's config.json: sliding_window 131072 with use_sliding_window false
    assert notes("qwen", model_type="qwen2", sliding_window=131072, use_sliding_window=False) == []
    assert notes("whole", sliding_window=1024) == []  # = max_position_embeddings: full attention
    assert notes("mistral", model_type="mistral", sliding_window=256)  # Mistral 7B v0.1 style: on


def test_zero_kv_heads_is_an_error_not_multi_head_attention(tmp_path):
    from planc.errors import PlanError

    with pytest.raises(PlanError, match="kv_heads must be greater than 0, got 0"):
        load(tmp_path, {**LLAMA, "num_key_value_heads": 0})
    assert load(tmp_path / "b", {**LLAMA, "num_key_value_heads": None}).model.kv_heads == LLAMA["num_attention_heads"]
