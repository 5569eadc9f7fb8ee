"""Hugging Face models made here by transformers (random init, no download) load into planc exactly.

The reference is transformers' own model code: for each family planc reads, a model built from a
config with ``from_config``-style random weights is saved with ``save_pretrained`` (single file and
sharded), planc starts from it (``init = pretrained``), and both compute the same logits in fp32.
The projections get large weights (std 0.3), so attention is far from uniform and a wrong RoPE
layout or fused-QKV order changes the logits by O(1), not by rounding (see
test_the_rope_conversion_is_what_makes_them_equal).
"""

import json
import math

import pytest
import torch

from planc.runtime.transformer import apply_rope, build_model, rope_table
from planc.spec import build_plan
from planc.weights import hf_names
from planc.weights.import_hf import load_pretrained

transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-4
VOCAB = 100  # padded to 128 by planc: the padding rows load as zeros


def _save(model, directory, **kwargs):
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 2:
                param.normal_(0.0, 0.3)
            elif param.ndim == 1:
                param.normal_(1.0 if "norm" in name or "ln" in name else 0.0, 0.1)
    model.save_pretrained(directory, **kwargs)
    return model.eval()


#: A small Llama-layout model (GQA: 4 query heads, 2 KV heads), for Llama and Qwen2.
LLAMA_SHAPE = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=32,
    rope_theta=50.0,
)


def _llama(tmp_path, **extra):
    config = transformers.LlamaConfig(**LLAMA_SHAPE, rms_norm_eps=1e-6, **extra)
    return _save(transformers.LlamaForCausalLM(config), tmp_path / "hf")


def _qwen2(tmp_path):
    config = transformers.Qwen2Config(**LLAMA_SHAPE, tie_word_embeddings=True, use_sliding_window=False)
    return _save(transformers.Qwen2ForCausalLM(config), tmp_path / "hf")


def _gpt2(tmp_path, **kwargs):
    config = transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=48, bos_token_id=0, eos_token_id=0
    )
    return _save(transformers.GPT2LMHeadModel(config), tmp_path / "hf", **kwargs)


def _neox(tmp_path, **extra):
    settings = dict(rotary_pct=1.0, use_parallel_residual=False, hidden_act="gelu_pytorch_tanh", rope_theta=80.0)
    config = transformers.GPTNeoXConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=VOCAB,
        max_position_embeddings=32,
        **{**settings, **extra},
    )
    return _save(transformers.GPTNeoXForCausalLM(config), tmp_path / "hf")


def _planc_model(tmp_path, seq_len=32):
    raw = {
        "model": {"from": str(tmp_path / "hf"), "init": "pretrained", "seq_len": seq_len},
        "hardware": {"device": "cpu", "per_node": 1},
        "train": {"global_batch": 1},
    }
    spec = build_plan(raw).model
    model = build_model(spec)
    load_pretrained(model, spec)
    return model.eval(), spec


def _max_logit_difference(ours, theirs, seq_len=32) -> float:
    tokens = torch.randint(0, VOCAB, (2, seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = theirs(tokens).logits
        got = ours(tokens)[..., :VOCAB]
    assert expected.abs().max() > 1.0  # logits large enough that a wrong layout could not hide
    return (got - expected).abs().max().item()


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "gpt_neox"])
def test_transformers_model_loads_into_planc_with_equal_logits(tmp_path, family):
    theirs = {"llama": _llama, "qwen2": _qwen2, "gpt2": _gpt2, "gpt_neox": _neox}[family](tmp_path)
    ours, spec = _planc_model(tmp_path)
    assert spec.padded_vocab == 128 and spec.vocab == VOCAB
    assert _max_logit_difference(ours, theirs) < TOLERANCE
    assert torch.count_nonzero(ours.tok_embeddings.weight[VOCAB:]) == 0  # padding rows


def test_sharded_checkpoint_and_a_shorter_position_table(tmp_path):
    """save_pretrained's shards (model.safetensors.index.json) load; planc takes the first seq_len
    rows of GPT-2's 48 learned positions."""
    theirs = _gpt2(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert len(list((tmp_path / "hf").glob("model-*.safetensors"))) > 2
    ours, spec = _planc_model(tmp_path, seq_len=24)
    assert spec.seq_len == 24 and ours.pos_embeddings.weight.shape == (24, 64)
    assert _max_logit_difference(ours, theirs, seq_len=24) < TOLERANCE


def test_the_rope_conversion_is_what_makes_them_equal(tmp_path, monkeypatch):
    """The negative control: without the row permutation the same load is far off."""
    theirs = _llama(tmp_path)
    plain = hf_names.RowMap.hf_row

    def no_permutation(self, row):
        return plain(hf_names.RowMap(self.offset, self.head_dim, self.head_stride, False, self.valid_rows), row)

    monkeypatch.setattr(hf_names.RowMap, "hf_row", no_permutation)
    ours, _ = _planc_model(tmp_path)
    assert _max_logit_difference(ours, theirs) > 0.1


def test_rope_row_permutation_derived_from_both_definitions():
    """planc rotates pairs (x[2i], x[2i+1]); Hugging Face's rotate_half rotates (x[i], x[i+d/2]), both
    by position * theta^(-2i/d). Written out here from the RoFormer/transformers formulas: rotating
    a query whose features are permuted by RowMap(rope=True) gives the permuted rotated query."""
    d, seq, theta = 8, 5, 10000.0
    x = torch.randn(1, seq, 1, d)
    table = rope_table(seq, d, theta)  # [seq, d/2, (cos, sin)]
    ours = apply_rope(x, table)[0, :, 0]
    # Hugging Face: cos/sin repeated over the two halves, q * cos + rotate_half(q) * sin
    cos = torch.cat([table[..., 0], table[..., 0]], dim=-1)
    sin = torch.cat([table[..., 1], table[..., 1]], dim=-1)
    rows = hf_names.RowMap(head_dim=d, rope=True)
    to_hf = [rows.hf_row(r) for r in range(d)]  # planc feature r sits at Hugging Face feature to_hf[r]
    hf_x = torch.empty(seq, d)
    hf_x[:, to_hf] = x[0, :, 0]
    rotate_half = torch.cat([-hf_x[:, d // 2 :], hf_x[:, : d // 2]], dim=-1)
    hf_rotated = hf_x * cos + rotate_half * sin
    assert torch.allclose(hf_rotated[:, to_hf], ours, atol=1e-6)
    # planc row 2i + c <-> Hugging Face row c * d/2 + i
    assert to_hf == [0, 4, 1, 5, 2, 6, 3, 7]
    assert math.isclose(table[1, 1, 0].item(), math.cos(theta ** (-2 / d)), rel_tol=1e-6)


def test_a_config_planc_does_not_build_exactly_is_refused_before_loading(tmp_path):
    _neox(tmp_path, use_parallel_residual=True)
    raw = {
        "model": {"from": str(tmp_path / "hf"), "init": "pretrained"},
        "hardware": {"device": "cpu", "per_node": 1},
        "train": {"global_batch": 1},
    }
    from planc.spec.issues import SpecError

    with pytest.raises(SpecError) as caught:
        build_plan(raw)
    (issue,) = caught.value.issues
    assert issue.path == ("model", "init") and "use_parallel_residual = true" in issue.message
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["use_parallel_residual"] is True


@pytest.mark.parametrize("family", ["llama", "gpt2", "gpt_neox"])
def test_a_shard_reads_exactly_its_block_of_the_full_tensor(tmp_path, family):
    """What a TP/FSDP rank reads (rows a..b, columns c..d of a planc tensor, through the RoPE
    permutation, fused QKV and Conv1D transpose) is that block of what one process loads whole."""
    from safetensors import safe_open

    from planc.weights.hf_names import tensor_sources
    from planc.weights.import_hf import read_block

    {"llama": _llama, "gpt2": _gpt2, "gpt_neox": _neox}[family](tmp_path)
    whole, spec = _planc_model(tmp_path)
    sources = tensor_sources(spec, family)
    blocks = [((0, 0), (16, 64)), ((5, 3), (7, 20)), ((16, 32), (16, 32)), ((60, 0), (3, 64))]
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), framework="pt") as stored:
        for name in ("layers.1.attention.wq.weight", "layers.0.attention.wk.weight", "layers.1.attention.wv.weight"):
            source = sources[name]
            full = dict(whole.named_parameters())[name].detach()
            for (row, col), (rows, cols) in blocks:
                rows, cols = min(rows, full.shape[0] - row), min(cols, full.shape[1] - col)
                if rows <= 0:
                    continue
                got = read_block(stored.get_slice(source.hf_name), source, (row, col), (rows, cols))
                assert torch.equal(got, full[row : row + rows, col : col + cols]), (name, row, col)
        embedding = sources["tok_embeddings.weight"]  # rows 96..127 are padding: zeros, none read
        got = read_block(stored.get_slice(embedding.hf_name), embedding, (96, 8), (32, 16))
        assert torch.equal(got[:4], whole.tok_embeddings.weight.detach()[96:100, 8:24]) and not got[4:].any()


def test_pipeline_stages_load_their_own_layers_and_the_tied_output(tmp_path):
    """Split as the pipeline strategy splits (layers deleted, ends set to None): each stage loads
    the same values as the whole model; the last stage's tied output is the embedding."""
    import copy

    _gpt2(tmp_path)
    whole, spec = _planc_model(tmp_path)
    assert spec.tie_embeddings
    for stage, keep in ((0, {"0"}), (1, {"1"})):
        part = copy.deepcopy(build_model(spec, device="meta"))
        for name in list(part.layers):
            if name not in keep:
                del part.layers[name]
        if stage == 0:
            part.norm = part.output = None
        else:
            part.tok_embeddings = part.pos_embeddings = None
        part.to_empty(device="cpu")
        load_pretrained(part, spec)
        expected = dict(whole.named_parameters())
        for name, param in part.named_parameters():
            source = "tok_embeddings.weight" if name == "output.weight" else name
            assert torch.equal(param, expected[source]), name
        assert (stage == 1) == ("output.weight" in dict(part.named_parameters()))


@pytest.mark.parametrize(
    "layout",
    [
        dict(tp=2, pp=1, dp=2, zero=3, schedule=None, sequence_parallel=False),  # FSDP over TP: _StridedShard
        dict(tp=2, pp=2, dp=1, zero=0, schedule="1f1b", sequence_parallel=True),
    ],
    ids=["fsdp-over-tp", "pp-tp-sp"],
)
def test_every_rank_of_a_layout_loads_exactly_its_shards(tmp_path, layout):
    """The real strategies (compose) on each of 4 ranks of torch's fake process group -- no processes,
    no communication: every local shard equals DTensor's own sharding of the whole-model value."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from planc.runtime.compose import compose
    from planc.runtime.transformer import canonical_name
    from planc.spec import Layout
    from planc.strategies.registry import load_registry

    _llama(tmp_path)
    raw = {
        "model": {"from": str(tmp_path / "hf"), "init": "pretrained"},
        "hardware": {"device": "cpu", "per_node": 4},
        "train": {"global_batch": 4, "precision": "fp32"},
    }
    plan = build_plan(raw)
    whole = build_model(plan.model)
    load_pretrained(whole, plan.model)
    expected = dict(whole.named_parameters())
    placements = set()
    registry = load_registry()
    if dist.is_initialized():  # a one-process group an earlier in-process job left behind
        dist.destroy_process_group()
    for rank in range(4):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
        try:
            job = compose(plan, Layout(**layout, recompute="none", micro_batch=2), registry)
            for part in job.unwrapped_parts():
                for name, param in part.named_parameters():
                    full = expected[canonical_name(name, plan.model)].detach()
                    assert isinstance(param, DTensor), name
                    placements.add(str(param.placements))
                    want = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
                    assert torch.equal(param.to_local(), want.to_local()), (rank, name, param.placements)
        finally:
            dist.destroy_process_group()
    if layout["zero"] == 3:
        assert any("_StridedShard" in p for p in placements)
