"""Weights out and back in, for real: train with `planc run`, export, load in transformers, import, train on.

For a Llama-shaped model (SwiGLU, RMSNorm, RoPE, GQA; trained tensor parallel) and a GPT-2-shaped
one (GELU, LayerNorm, learned positions, tied embeddings; trained pipeline parallel):

1. `planc run` trains a few steps and checkpoints (DCP, sharded by that layout);
2. `planc export` writes Hugging Face safetensors + config.json, and `--format torch` one state dict;
3. transformers' `AutoModelForCausalLM.from_pretrained` loads the export, and its logits equal
   planc's (fp32, within 1e-4) on the same tokens -- Hugging Face's own model code is the reference;
4. a plan `model from "EXPORT" { init = pretrained }` trains on at another layout (FSDP, TP), and
   its losses equal those of the single-process reference started from the torch export's
   weights (the weights never left planc) within the equivalence bound (fp32: 1e-5).

The vocabulary (90) is padded (to 96): the export drops the padding rows, the import fills them
with zeros, the reference keeps the trained ones -- the losses agree only because the loss masks them.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from planc.cli import main
from planc.dsl import load_plan
from planc.runtime import reference
from planc.runtime.transformer import build_model
from planc.strategies.registry import load_registry

pytestmark = pytest.mark.dist

FP32_TOLERANCE = 1e-5
LOGITS_TOLERANCE = 1e-4
TRAIN = "global_batch = 8  micro_batch = 2  precision = fp32  lr = 1e-2  warmup_steps = 1  seed = 3"

LLAMA = """
model "tiny-llama" {
  layers = 2  hidden = 32  heads = 4  kv_heads = 2  vocab = 90  vocab_multiple = 32  seq_len = 16
  mlp = swiglu  norm = rmsnorm  position = rope  rope_theta = 500
}
"""
GPT2 = """
model "tiny-gpt2" {
  layers = 2  hidden = 32  heads = 4  vocab = 90  vocab_multiple = 32  seq_len = 16
  mlp = gelu  norm = layernorm  position = learned  tie_embeddings = true
}
"""


def _plan_text(model: str, layout: str, steps: int, checkpoint: bool) -> str:
    text = f'{model}\nhardware {{ device = "cpu"  per_node = 2 }}\ntrain {{ {TRAIN}  steps = {steps} }}\n'
    text += f"layout {{ {layout} }}\n"
    return text + ("checkpoint { every = 4 }\n" if checkpoint else "")


def _planc_run(plan: Path, out: Path) -> list[float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "planc", "run", str(plan), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _round_trip(tmp_path: Path, model: str, train_layout: str, import_layout: str, hf_class: str) -> None:
    from transformers import AutoModelForCausalLM

    first = tmp_path / "first.plan"
    first.write_text(_plan_text(model, train_layout, steps=4, checkpoint=True))
    losses = _planc_run(first, tmp_path / "run")
    assert losses[-1] < losses[0]  # it trained

    assert main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "hf")]) == 0
    assert main(["export", str(tmp_path / "run"), "--to", str(tmp_path / "pt"), "--format", "torch"]) == 0
    state = torch.load(tmp_path / "pt" / "model.pt", weights_only=True)  # tensors only, no pickled code
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == [hf_class] and config["vocab_size"] == 90

    # 3. transformers' model code computes what planc's does, on the exported weights.
    plan = load_plan(first, strategies=load_registry())
    ours = build_model(plan.model)
    ours.load_state_dict(state)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="sdpa").eval()
    assert type(theirs).__name__ == hf_class
    tokens = torch.randint(0, 90, (3, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = theirs(tokens).logits
        got = ours(tokens)[..., :90]
    assert expected.shape == got.shape == (3, 16, 90)
    assert (got - expected).abs().max().item() < LOGITS_TOLERANCE

    # 4. Back into planc at another layout, against the reference started from the same weights.
    second = tmp_path / "second.plan"
    second.write_text(
        _plan_text('model from "hf" { init = pretrained  vocab_multiple = 32 }', import_layout, 3, checkpoint=False)
    )
    continued = _planc_run(second, tmp_path / "run2")
    plan = load_plan(second, strategies=load_registry())
    assert plan.model.init == "pretrained" and plan.model.padded_vocab == 96

    def from_torch_export(model, spec, seed, root=None):  # the weights that never left planc (padding rows trained)
        model.load_state_dict(state)

    patch = pytest.MonkeyPatch()
    patch.setattr(reference, "initialise", from_torch_export)
    try:
        expected_losses = reference.train_reference(plan, steps=3).losses
    finally:
        patch.undo()
    assert len(continued) == 3
    assert max(abs(a - b) for a, b in zip(continued, expected_losses)) < FP32_TOLERANCE
    # and it went on from the trained model, not from scratch (a fresh model starts near ln 90 = 4.50)
    assert continued[0] < losses[0] - 0.1


def test_llama_tensor_parallel_checkpoint_to_transformers_and_back_under_fsdp(tmp_path):
    _round_trip(tmp_path, LLAMA, "tp = 2  pp = 1  dp = 1", "tp = 1  pp = 1  dp = 2  zero = 3", "LlamaForCausalLM")


def test_gpt2_pipeline_checkpoint_to_transformers_and_back_under_tensor_parallel(tmp_path):
    _round_trip(tmp_path, GPT2, "tp = 1  pp = 2  dp = 1  schedule = 1f1b", "tp = 2  pp = 1  dp = 1", "GPT2LMHeadModel")
