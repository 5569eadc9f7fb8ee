"""Parameters per pipeline stage and TP shard: hand-derived counts."""

import pytest

from planc.cost.params import layer_params_per_shard, stage_params
from planc.spec import build_plan


def model(**kw):
    base = dict(layers=4, hidden=64, heads=4, vocab=1000, seq_len=32, vocab_multiple=8)
    base.update(kw)
    return build_plan({"model": base, "hardware": {"device": "cpu"}, "train": {"global_batch": 8}}).model


def test_gelu_layer_shard_golden():
    # h = 64, f = 256 (4h), biased LayerNorm, MHA (kv = h). Per layer:
    #   norms: 2 x (64 weight + 64 bias) = 256, replicated
    #   attention: QKV 64 x 192 = 12288 + bias 192 (column: sharded); out 64 x 64 = 4096 (row) + bias 64 (replicated)
    #   MLP: fc1 64 x 256 = 16384 + bias 256 (column); fc2 256 x 64 = 16384 (row) + bias 64 (replicated)
    # sharded = 12288 + 192 + 4096 + 16384 + 256 + 16384 = 49600; replicated = 256 + 64 + 64 = 384
    m = model()
    assert layer_params_per_shard(m, 1) == 49600 + 384 == m.params_per_layer
    assert layer_params_per_shard(m, 2) == 49600 // 2 + 384
    assert layer_params_per_shard(m, 4) == 49600 // 4 + 384


def test_swiglu_gqa_layer_shard_golden():
    # h = 64, heads 4 (head_dim 16), kv_heads 2 -> kv = 32; swiglu ffn 192; RMSNorm, no biases.
    #   norms 2 x 64 = 128; attention 2 x 64 x 64 + 2 x 64 x 32 = 12288; MLP 3 x 64 x 192 = 36864
    m = model(kv_heads=2, mlp="swiglu", norm="rmsnorm", position="rope", ffn=192)
    assert m.params_per_layer == 128 + 12288 + 36864
    assert layer_params_per_shard(m, 2) == (12288 + 36864) // 2 + 128


def test_qwen2_qkv_biases_are_column_parallel():
    # as above, plus Qwen2's biases on q (64), k (32) and v (32): 128 more, sharded with their columns
    m = model(kv_heads=2, mlp="swiglu", norm="rmsnorm", position="rope", ffn=192, qkv_bias=True)
    assert m.params_per_layer == 128 + 12288 + 36864 + 128
    assert layer_params_per_shard(m, 2) == (12288 + 36864 + 128) // 2 + 128


@pytest.mark.parametrize("pp,v", [(1, 1), (2, 1), (4, 1), (2, 2)])
def test_stages_add_up_to_the_model(pp, v):
    m = model(layers=8, tie_embeddings=False)
    total = sum(stage_params(m, 1, pp, v, r).params for r in range(pp))
    assert total == m.params


def test_embedding_on_first_stage_head_on_last():
    m = model(layers=8)
    first, last = stage_params(m, 1, 4, 1, 0), stage_params(m, 1, 4, 1, 3)
    # padded vocab 1000 (multiple of 8), h = 64: embedding 64000 + learned positions 32 x 64 = 2048
    assert first.params == 2 * m.params_per_layer + 64000 + 2048
    # final LayerNorm 128 + untied head 64000
    assert last.params == 2 * m.params_per_layer + 128 + 64000
    assert first.embedding and not first.head and last.head and not last.embedding


def test_vocab_parallel_embedding_and_replicated_positions():
    m = model(layers=2)
    # tp = 4: embedding rows 1000 / 4 = 250 x 64 = 16000; positions replicated 2048
    assert stage_params(m, 4, 1, 1, 0).params == 2 * layer_params_per_shard(m, 4) + 16000 + 2048 + 128 + 16000


def test_tied_head_is_a_copy_on_the_last_stage_only_with_pipeline():
    m = model(layers=4, tie_embeddings=True)
    assert stage_params(m, 1, 1, 1, 0).params == m.params  # one stage: shared
    assert stage_params(m, 1, 2, 1, 1).params == 2 * m.params_per_layer + 128 + 64000  # copy


def test_zbv_puts_the_embedding_and_the_head_on_rank_0():
    # ZB-V, pp 4 x v 2: 8 layers in 8 stages of 1; rank r holds stages r and 7 - r (planc.stages).
    # Rank 0 holds stage 0 (the embedding, 64000 + 2048 positions) and stage 7 (final LayerNorm 128 + head
    # 64000); rank 3 holds the middle of the model, stages 3 and 4, and neither.
    m = model(layers=8)
    first, last = stage_params(m, 1, 4, 2, 0, "v"), stage_params(m, 1, 4, 2, 3, "v")
    assert first.embedding and first.head and not last.embedding and not last.head
    assert first.params == 2 * m.params_per_layer + 64000 + 2048 + 128 + 64000
    assert last.params == 2 * m.params_per_layer
    # the looped placement of the same layout keeps the head on the last rank
    assert stage_params(m, 1, 4, 2, 3).head and not stage_params(m, 1, 4, 2, 0).head
