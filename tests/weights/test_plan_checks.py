"""`planc check` on plans with `init = pretrained`: located errors before any process starts.

The weights directories are written here with safetensors (headers are all `planc check` reads).
"""

import json

import pytest
import torch
from safetensors.torch import save_file

from planc.cli import main
from planc.spec import build_plan
from planc.weights.hf_configs import config_for
from planc.weights.hf_names import hf_shapes

HARDWARE_TRAIN = 'hardware { device = "cpu"  per_node = 1 }\ntrain { global_batch = 1 }\n'
LLAMA = dict(layers=2, hidden=32, heads=4, kv_heads=2, vocab=90, seq_len=16, mlp="swiglu", norm="rmsnorm")


def _spec(**keys):
    raw = {
        "model": {**LLAMA, "position": "rope", **keys},
        "hardware": {"device": "cpu", "per_node": 1},
        "train": {"global_batch": 1},
    }
    return build_plan(raw).model


def _weights_dir(path, spec, family="llama", config_changes=None, drop=(), extra=()):
    """A Hugging Face model directory for ``spec``: config.json and model.safetensors (zeros)."""
    path.mkdir()
    config = {**config_for(spec, family), **(config_changes or {})}
    (path / "config.json").write_text(json.dumps(config))
    tensors = {name: torch.zeros(shape) for name, shape in hf_shapes(spec, family).items() if name not in drop}
    tensors.update({name: torch.zeros(2) for name in extra})
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def _check(tmp_path, capsys, model_block):
    plan = tmp_path / "p.plan"
    plan.write_text(model_block + "\n" + HARDWARE_TRAIN)
    status = main(["check", str(plan)])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def test_matching_weights_pass(tmp_path, capsys):
    _weights_dir(tmp_path / "hf", _spec())
    status, out = _check(tmp_path, capsys, 'model from "hf" {\n  init = pretrained\n}')
    assert status == 0, out
    assert f"starting from the weights in {(tmp_path / 'hf').resolve()}" in out
    plan = build_plan(
        {
            "model": {"from": str(tmp_path / "hf"), "init": "pretrained"},
            "hardware": {"device": "cpu", "per_node": 1},
            "train": {},
        }
        | {"train": {"global_batch": 1}}
    )
    assert plan.model.weights == str(tmp_path / "hf") and plan.data_root is None  # absolute: as written


def test_a_relative_weights_path_is_carried_as_written_and_found_under_the_data_root(tmp_path):
    """As the data paths (docs/data.md): the plan keeps "hf" and records its directory; at run time
    the weights are read under --data-root when the program is given one."""
    from planc.dsl import load_plan
    from planc.runtime.transformer import build_model
    from planc.strategies.registry import load_registry
    from planc.weights.import_hf import initialise
    from planc.weights.plan_checks import weights_directory

    (tmp_path / "plans").mkdir()
    _weights_dir(tmp_path / "plans" / "hf", _spec())
    plan_file = tmp_path / "plans" / "p.plan"
    plan_file.write_text('model from "hf" {\n  init = pretrained\n}\n' + HARDWARE_TRAIN)
    plan = load_plan(plan_file, strategies=load_registry())
    assert plan.model.weights == "hf" and plan.data_root == str((tmp_path / "plans").resolve())
    assert weights_directory(plan.model, plan.data_root) == (tmp_path / "plans" / "hf").resolve()

    # Another machine: the same weights under another root; random values, so a match is no accident.
    elsewhere = tmp_path / "copy"
    elsewhere.mkdir()
    (elsewhere / "hf").mkdir()
    (elsewhere / "hf" / "config.json").write_text((tmp_path / "plans" / "hf" / "config.json").read_text())
    values = {name: torch.randn(shape) for name, shape in hf_shapes(plan.model, "llama").items()}
    save_file(values, str(elsewhere / "hf" / "model.safetensors"), metadata={"format": "pt"})
    model = build_model(plan.model)
    initialise(model, plan.model, seed=0, root=elsewhere)
    assert torch.equal(model.tok_embeddings.weight[:90], values["model.embed_tokens.weight"])


def test_pretrained_without_a_directory(tmp_path, capsys):
    status, out = _check(tmp_path, capsys, 'model {\n  preset = "gpt2"\n  init = pretrained\n}')
    assert status == 1
    assert "p.plan:3:10: error: init = pretrained needs the weights' directory" in out
    assert "hint: point model from" in out


def test_weights_without_pretrained(tmp_path, capsys):
    status, out = _check(tmp_path, capsys, 'model {\n  preset = "gpt2"\n  weights = "hf"\n}')
    assert status == 1 and "weights are read only with init = pretrained" in out and "p.plan:3:13" in out


def test_a_smaller_model_than_the_weights(tmp_path, capsys):
    _weights_dir(tmp_path / "hf", _spec())
    status, out = _check(tmp_path, capsys, 'model from "hf" {\n  init = pretrained\n  layers = 1\n}')
    assert status == 1
    assert "p.plan:2:10" in out and "planc's model has no place for" in out and "model.layers.1." in out


def test_a_wider_model_than_the_weights(tmp_path, capsys):
    _weights_dir(tmp_path / "hf", _spec())
    status, out = _check(tmp_path, capsys, 'model from "hf" {\n  init = pretrained\n  ffn = 128\n}')
    assert status == 1 and "mlp.gate_proj.weight has shape [256, 32]" in out and "needs [128, 32]" in out


def test_missing_tensor_and_pickles_only(tmp_path, capsys):
    _weights_dir(tmp_path / "hf", _spec(), drop=("model.norm.weight",))
    status, out = _check(tmp_path, capsys, 'model from "hf" { init = pretrained }')
    assert status == 1 and "has no tensor 'model.norm.weight'" in out
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"not read")
    status, out = _check(tmp_path, capsys, 'model from "bin" { init = pretrained }')
    assert status == 1 and "planc reads safetensors only, never pickles" in out


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0}}, "RoPE type 'llama3'"),
        ({"sliding_window": 8}, "sliding-window attention over 8 tokens, shorter than seq_len = 16"),
    ],
)
def test_what_planc_would_build_differently_is_refused(tmp_path, capsys, changes, expected):
    _weights_dir(tmp_path / "hf", _spec(), config_changes=changes)
    status, out = _check(tmp_path, capsys, 'model from "hf" { init = pretrained }')
    assert status == 1 and expected in out, out


def test_qwen2_needs_its_qkv_biases(tmp_path, capsys):
    _weights_dir(tmp_path / "hf", _spec(qkv_bias=True))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "qwen2"  # what planc exports a model with q/k/v-only biases as
    assert _check(tmp_path, capsys, 'model from "hf" { init = pretrained }')[0] == 0
    status, out = _check(tmp_path, capsys, 'model from "hf" { init = pretrained  qkv_bias = false }')
    assert status == 1 and "Qwen2 has biases on q, k and v, but the plan has qkv_bias = false" in out


def test_an_override_that_unties_tied_weights(tmp_path, capsys):
    _weights_dir(tmp_path / "hf", _spec(), config_changes={"tie_word_embeddings": True})
    status, out = _check(tmp_path, capsys, 'model from "hf" { init = pretrained  tie_embeddings = false }')
    assert status == 1 and "tie_word_embeddings = true, but the plan has tie_embeddings = false" in out


def test_a_sliding_window_as_long_as_the_sequence_is_full_attention(tmp_path, capsys):
    _weights_dir(tmp_path / "hf", _spec(), config_changes={"model_type": "mistral", "sliding_window": 16})
    status, out = _check(tmp_path, capsys, 'model from "hf" { init = pretrained }')
    assert status == 0, out


def test_preset_plus_weights_directory(tmp_path, capsys):
    """The architecture may come from the plan and the weights from elsewhere: the keys must agree."""
    spec = _spec(position="learned", mlp="gelu", norm="layernorm", kv_heads=4, tie_embeddings=True)
    _weights_dir(tmp_path / "gpt2", spec, family="gpt2")
    block = (
        "model {\n  layers = 2  hidden = 32  heads = 4  vocab = 90  seq_len = 16  tie_embeddings = true\n"
        '  init = pretrained\n  weights = "gpt2"\n}'
    )
    status, out = _check(tmp_path, capsys, block)
    assert status == 0, out
