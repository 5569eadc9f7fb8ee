"""The reference transformer: parameter count, shapes, attention maths, RoPE, layout-independent init."""

import math

import pytest
import torch

from planc.runtime.transformer import (
    apply_rope,
    build_model,
    canonical_name,
    count_parameters,
    init_weights,
    loss_fn,
    rope_table,
)
from planc.spec import ModelSpec, build_plan

GPT_LIKE = dict(layers=2, hidden=64, heads=4, vocab=300, seq_len=16, tie_embeddings=True)  # bias, learned, layernorm
LLAMA_LIKE = dict(
    layers=2, hidden=64, heads=4, kv_heads=2, vocab=300, seq_len=16, mlp="swiglu", norm="rmsnorm", position="rope"
)
MIXED = dict(layers=3, hidden=48, heads=6, kv_heads=3, vocab=1000, seq_len=8, mlp="gelu", bias=False, position="rope")


def spec(**kw) -> ModelSpec:
    return ModelSpec(**kw)


def preset(name: str) -> ModelSpec:
    return build_plan({"model": {"preset": name}, "hardware": {"device": "cpu"}, "train": {"global_batch": 1}}).model


@pytest.mark.parametrize(
    "kw", [GPT_LIKE, LLAMA_LIKE, MIXED, {**LLAMA_LIKE, "qkv_bias": True}], ids=["gpt", "llama", "mixed", "qwen2"]
)
def test_parameter_count_equals_spec(kw):
    s = spec(**kw)
    assert count_parameters(build_model(s)) == s.params


@pytest.mark.parametrize("name", ["gpt2", "llama3-8b"])
def test_parameter_count_of_presets_on_meta(name):
    # The spec's count is checked against the published counts in tests/spec/test_model_params.py;
    # the built module (on meta: nothing allocated) must have exactly that many parameters.
    s = preset(name)
    assert count_parameters(build_model(s, device="meta")) == s.params


def test_forward_shapes_and_initial_loss():
    s = spec(**LLAMA_LIKE)
    model = build_model(s)
    init_weights(model, seed=0)
    tokens = torch.randint(0, s.vocab, (3, s.seq_len), generator=torch.Generator().manual_seed(0))
    logits = model(tokens)
    assert logits.shape == (3, s.seq_len, s.padded_vocab)
    # Logits have std ~ 0.02 * sqrt(hidden) = 0.16 after the unit-scale final norm, so the loss is
    # about ln(padded_vocab) + 0.16^2 / 2 = ln 384 + 0.013 = 5.96; 0.1 leaves room for sampling noise.
    assert abs(loss_fn(logits, tokens).item() - math.log(s.padded_vocab)) < 0.1


def test_tied_weights_are_shared_also_after_meta_materialisation():
    s = spec(**GPT_LIKE)
    model = build_model(s, device="meta")
    model.to_empty(device="cpu")
    assert model.output.weight is model.tok_embeddings.weight
    untied = build_model(spec(**LLAMA_LIKE))
    assert untied.output.weight is not untied.tok_embeddings.weight


def test_module_names_are_the_interface():
    names = {n for n, _ in build_model(spec(**LLAMA_LIKE)).named_parameters()}
    for expected in [
        "tok_embeddings.weight",
        "layers.1.attention_norm.weight",
        "layers.1.attention.wq.weight",
        "layers.1.attention.wk.weight",
        "layers.1.attention.wv.weight",
        "layers.1.attention.wo.weight",
        "layers.1.ffn_norm.weight",
        "layers.1.feed_forward.w1.weight",
        "layers.1.feed_forward.w2.weight",
        "layers.1.feed_forward.w3.weight",
        "norm.weight",
        "output.weight",
    ]:
        assert expected in names
    gpt = {n for n, _ in build_model(spec(**GPT_LIKE)).named_parameters()}
    assert {"pos_embeddings.weight", "layers.0.attention.wq.bias", "layers.0.attention_norm.bias"} <= gpt
    assert not any("w3" in n for n in gpt) and "output.weight" not in gpt  # tied: listed once


def reference_rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """RoFormer Eq. 34 written out: pair (x[2i], x[2i+1]) at position m, as a complex number times e^{i m w_i}."""
    out = torch.empty_like(x)
    b, s, nh, d = x.shape
    for m in range(s):
        for i in range(d // 2):
            w = theta ** (-2 * i / d)
            rot = complex(math.cos(m * w), math.sin(m * w))
            for bi in range(b):
                for h in range(nh):
                    z = complex(x[bi, m, h, 2 * i].item(), x[bi, m, h, 2 * i + 1].item()) * rot
                    out[bi, m, h, 2 * i], out[bi, m, h, 2 * i + 1] = z.real, z.imag
    return out


def test_rope_matches_hand_written_rotation():
    x = torch.randn(2, 5, 3, 8, dtype=torch.float64)
    got = apply_rope(x, rope_table(5, 8, 100.0).double())
    torch.testing.assert_close(got, reference_rope(x, 100.0), atol=1e-6, rtol=1e-6)
    # Position 0 is not rotated.
    torch.testing.assert_close(got[:, 0], x[:, 0])


def test_attention_equals_explicit_repeated_kv_causal_softmax():
    s = spec(**LLAMA_LIKE)  # 4 query heads, 2 kv heads, RoPE
    model = build_model(s)
    init_weights(model, seed=1)
    attn = model.layers["0"].attention
    x = torch.randn(2, s.seq_len, s.hidden)
    rope = rope_table(s.seq_len, s.head_dim, s.rope_theta)
    got = attn(x, rope)

    b, t, d = 2, s.seq_len, s.head_dim
    q = apply_rope(attn.wq(x).view(b, t, s.heads, d), rope).transpose(1, 2)
    k = apply_rope(attn.wk(x).view(b, t, s.kv_heads, d), rope).transpose(1, 2)
    v = attn.wv(x).view(b, t, s.kv_heads, d).transpose(1, 2)
    # GQA (Ainslie et al. 2023): query head i uses kv head i // (heads / kv_heads).
    rep = s.heads // s.kv_heads
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    expected = attn.wo((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kw", [GPT_LIKE, LLAMA_LIKE], ids=["gpt", "llama"])
def test_future_tokens_do_not_change_earlier_logits(kw):
    s = spec(**kw)
    model = build_model(s)
    init_weights(model, seed=0)
    tokens = torch.randint(0, s.vocab, (2, s.seq_len))
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % s.vocab
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


# -- initialisation --------------------------------------------------------------------------------


def test_init_statistics_follow_gpt2_scheme():
    s = spec(layers=4, hidden=128, heads=4, vocab=512, seq_len=16)
    model = build_model(s)
    init_weights(model, seed=0)
    p = dict(model.named_parameters())
    assert torch.all(p["layers.0.attention.wq.bias"] == 0) and torch.all(p["norm.weight"] == 1)
    assert torch.all(p["layers.2.ffn_norm.bias"] == 0)
    # 16k samples: the sample std is within ~1% of the true one; 5% leaves room.
    assert p["layers.0.attention.wq.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    assert p["tok_embeddings.weight"].std().item() == pytest.approx(0.02, rel=0.05)
    scaled = 0.02 / math.sqrt(2 * 4)  # GPT-2: 1/sqrt(N residual layers), N = 2 per block x 4 blocks
    assert p["layers.3.attention.wo.weight"].std().item() == pytest.approx(scaled, rel=0.05)
    assert p["layers.3.feed_forward.w2.weight"].std().item() == pytest.approx(scaled, rel=0.05)


def test_init_depends_on_seed_and_name():
    s = spec(**LLAMA_LIKE)
    a, b, c = build_model(s), build_model(s), build_model(s)
    init_weights(a, 0), init_weights(b, 0), init_weights(c, 1)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.layers["0"].attention.wq.weight, c.layers["0"].attention.wq.weight)
    assert not torch.equal(a.layers["0"].attention.wq.weight, a.layers["1"].attention.wq.weight)


def split_into_stages(s: ModelSpec, seed: int):
    """Two pipeline-stage-like models: layers [0, 1) with embeddings, and [1, L) with norm + output."""
    first, last = build_model(s), build_model(s)
    for i in range(1, s.layers):
        del first.layers[str(i)]
    first.norm = first.output = None
    del last.layers["0"]
    last.tok_embeddings = last.pos_embeddings = None
    init_weights(first, seed), init_weights(last, seed)
    return first, last


@pytest.mark.parametrize("kw", [GPT_LIKE, LLAMA_LIKE], ids=["gpt-tied", "llama"])
def test_init_of_pipeline_stages_equals_full_model(kw):
    s = spec(**kw)
    full = build_model(s)
    init_weights(full, seed=3)
    full_params = dict(full.named_parameters())
    first, last = split_into_stages(s, seed=3)
    for stage in (first, last):
        for name, p in stage.named_parameters():
            # A tied output on the last stage starts equal to the embedding it is tied to.
            assert torch.equal(p, full_params[canonical_name(name, s)]), name
    # The stages chained reproduce the full forward (parts set to None pass hidden states through).
    tokens = torch.randint(0, s.vocab, (2, s.seq_len))
    torch.testing.assert_close(last(first(tokens)), full(tokens))


def test_canonical_name_strips_wrappers():
    s = spec(**GPT_LIKE)
    assert canonical_name("module._orig_mod.layers.0._checkpoint_wrapped_module.ffn_norm.weight", s) == (
        "layers.0.ffn_norm.weight"
    )
    assert canonical_name("output.weight", s) == "tok_embeddings.weight"


def test_init_refuses_meta_parameters():
    with pytest.raises(ValueError, match="to_empty"):
        init_weights(build_model(spec(**GPT_LIKE), device="meta"), 0)


def test_gqa_in_bf16_uses_the_fused_path_and_agrees_with_fp32():
    # bf16 takes SDPA's enable_gqa path; fp32 repeats the kv heads first. Same maths, bf16 precision.
    s = spec(**LLAMA_LIKE)
    model = build_model(s)
    init_weights(model, seed=2)
    attn = model.layers["0"].attention
    x = torch.randn(2, s.seq_len, s.hidden, generator=torch.Generator().manual_seed(0))
    rope = rope_table(s.seq_len, s.head_dim, s.rope_theta)
    fp32 = attn(x, rope)
    bf16 = attn.to(torch.bfloat16)(x.bfloat16(), rope).float()
    # bf16 keeps 8 significant bits: relative error ~2^-8 = 0.4% per rounding, a few roundings deep.
    # (A wrong query-to-kv head mapping would give an O(1) relative error.)
    assert ((bf16 - fp32).norm() / fp32.norm()).item() < 0.02


def test_an_init_block_is_the_slice_of_the_full_init_across_tiles():
    # Blocks that start, end and straddle tile edges (tiles of 64 x 1024), an empty one, and the
    # matrix's cut edge tiles (200 x 2500: 4 x 3 tiles, the last ones 8 rows and 452 columns).
    from planc.runtime.transformer import INIT_TILE, full_init_value, init_value_slice

    assert INIT_TILE == (64, 1024)
    model_spec = ModelSpec(**GPT_LIKE)
    name = "layers.0.attention.wq.weight"
    full = full_init_value(name, torch.Size([200, 2500]), model_spec, 7)
    for offset, shape in [((63, 1000), (70, 30)), ((130, 2047), (70, 453)), ((64, 1024), (64, 1024)), ((5, 5), (0, 9))]:
        block = init_value_slice(name, (200, 2500), offset, shape, model_spec, 7)
        (r, c), (h, w) = offset, shape
        assert torch.equal(block, full[r : r + h, c : c + w]), offset
