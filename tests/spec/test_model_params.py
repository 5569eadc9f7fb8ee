"""Parameter counts of the presets against the counts their publishers report.

Published totals (Hugging Face model cards / `sum(p.numel())` of the released checkpoints):
llama2-7b 6,738,415,616; llama3-8b 8,030,261,248; mistral-7b 7,241,732,096;
llama3.2-1b 1,235,814,400 and llama3.2-3b 3,212,749,824 (the released safetensors' parameter
counts, meta-llama/Llama-3.2-1B and -3B; the head is tied to the embedding, counted once);
gpt2 124,439,808 with vocab 50257 — planc pads the vocabulary to 50304 (a multiple of 128),
which adds 47 rows x 768 = 36,096 parameters.
"""

import pytest

from planc.spec import build_plan

PUBLISHED = {
    "llama2-7b": 6_738_415_616,
    "llama3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "llama3.1-8b": 8_030_261_248,  # meta-llama/Llama-3.1-8B: Llama 3 8B's architecture
    "llama3.2-1b": 1_235_814_400,
    "llama3.2-3b": 3_212_749_824,
    "gpt2": 124_439_808 + 47 * 768,
}


def _model(**model):
    return build_plan({"model": model, "hardware": {"device": "A100-80GB"}, "train": {"global_batch": 8}}).model


@pytest.mark.parametrize("preset,count", PUBLISHED.items())
def test_preset_parameter_count_matches_published(preset, count):
    assert _model(preset=preset).params == count


def test_megatron_formula_for_untied_gpt():
    # Narayanan et al. 2021, Sec. 5.1: P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12lh)) for a GPT with
    # biases, LayerNorm, learned positions and *tied* embeddings; untied adds V*h for the head.
    l, h, V, s = 4, 256, 1024, 128
    m = _model(layers=l, hidden=h, heads=8, vocab=V, seq_len=s, vocab_multiple=1, tie_embeddings=False)
    formula = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    # Megatron's 13h per layer counts 2 LayerNorms (4h) + biases (9h); planc adds the final
    # LayerNorm (2h) that the formula leaves out.
    assert m.params == round(formula) + V * h + 2 * h


def test_swiglu_default_ffn_follows_llama_rule():
    # Llama: int(2 * 4h / 3) rounded up to a multiple of 256; 4096 -> 10922 -> 11008.
    assert _model(layers=1, hidden=4096, heads=32, vocab=256, seq_len=16, mlp="swiglu").ffn == 11008
    assert _model(layers=1, hidden=768, heads=12, vocab=256, seq_len=16).ffn == 3072


def test_vocab_is_padded_to_multiple():
    assert _model(preset="gpt2").padded_vocab == 50304
    assert _model(preset="llama3-8b").padded_vocab == 128256
