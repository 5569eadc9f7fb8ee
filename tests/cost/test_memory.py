"""Model states and activations: hand-derived values and the papers' closed forms."""

import pytest

from planc.cost.memory import (
    fsdp_gather_bytes,
    layer_activation_bytes,
    logits_bytes,
    model_state_bytes,
    runtime_state_bytes,
)
from planc.cost.profile import MEGATRON_LM_2021, PLANC_RUNTIME, ZERO_PAPER_MIXED_ADAM
from planc.spec import build_plan
from planc.strategies.fsdp.cost_pass import fsdp_forward_start_bytes


def gpt(**kw):
    base = dict(layers=4, hidden=1024, heads=16, vocab=1024, seq_len=2048)
    base.update(kw)
    return build_plan({"model": base, "hardware": {"device": "cpu"}, "train": {"global_batch": 8}}).model


def test_zero_formulas():
    # Psi = 1e9, N_d = 8, K = 12: baseline 16 GB; P_os 2+2+12/8 = 5.5; P_os+g 2+14/8 = 3.75; P_os+g+p 2
    psi = 1e9
    expected = {0: 16e9, 1: 5.5e9, 2: 3.75e9, 3: 2e9}
    for stage, total in expected.items():
        assert model_state_bytes(psi, 8, stage, ZERO_PAPER_MIXED_ADAM).total == pytest.approx(total)


def test_runtime_state_bytes():
    # DDP/ZeRO-1 (autocast, fp32 params): 4 + 0 + 4 + 8 = 16; SGD momentum 4 + 0 + 4 + 4 = 12
    assert runtime_state_bytes("bf16", "adamw", 0).total == 16
    assert runtime_state_bytes("bf16", "sgd", 1).total == 12
    # FSDP ZeRO-2 bf16: unsharded bf16 working copy 2 + sharded fp32 4 + grads 4 + Adam 8
    sb = runtime_state_bytes("bf16", "adam", 2)
    assert (sb.working, sb.master, sb.grads, sb.optimizer) == (2, 4, 4, 8)
    # ZeRO-3: the gathered copy is transient
    assert runtime_state_bytes("bf16", "adam", 3).working == 0
    # ZeRO-2 with 8 ranks, 1e9 params: 2e9 + (4 + 4 + 8) e9 / 8 = 4e9
    assert model_state_bytes(1e9, 8, 2, sb).total == pytest.approx(4e9)


def test_korthikanti_table2_reproduced_by_the_megatron_profile():
    # Korthikanti et al. 2022, Table 2 (per layer, 16-bit, dropout, materialized attention):
    #   none: s b h (34 + 5 a s / h);  TP: s b h (10 + 24/t + 5 a s/(h t));  TP+SP: s b h (34/t + 5 a s/(h t))
    #   selective + SP: 34 s b h / t;  full + SP: 2 s b h / t
    # plus what the paper leaves out as negligible: the two LayerNorms' fp32 mean and rstd per
    # token row, 2 x 8 s b (s b / t rows under SP).
    m = gpt()
    s, b, h, a = 2048, 2, 1024, 16
    sbh = s * b * h
    stats = 2 * 8 * s * b
    act = layer_activation_bytes(m, b, 1, False, 2, 2, MEGATRON_LM_2021)
    assert act.none == pytest.approx(sbh * (34 + 5 * a * s / h) + stats)
    t = 4
    act = layer_activation_bytes(m, b, t, False, 2, 2, MEGATRON_LM_2021)
    assert act.none == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)) + stats)
    act = layer_activation_bytes(m, b, t, True, 2, 2, MEGATRON_LM_2021)
    assert act.none == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)) + stats / t)
    assert act.selective == pytest.approx(sbh * 34 / t + stats / t)
    assert act.full == pytest.approx(2 * sbh / t)


def test_planc_runtime_activations_golden():
    # Fused attention, no dropout, bf16 GEMMs (e = 2), fp32 residual (r = 4), MHA, GELU f = 4h, no TP:
    #   norm inputs 2 r = 8; GEMM inputs: autocast casts the fp32 norm output once per linear,
    #   wq, wk, wv and w1 each save a bf16 copy: 4 e = 8; Q, K, V 3 e = 6; O once (SDPA returns
    #   it as a view the projection reads) e = 2; MLP 2 e x 4 = 16 -> 40 s b h, plus the fp32
    #   log-sum-exp 4 a s b and the norms' fp32 mean and rstd 2 x 8 s b
    m = gpt()
    s, b, h, a = 2048, 1, 1024, 16
    small = 4 * a * s * b + 2 * 8 * s * b
    act = layer_activation_bytes(m, b, 1, False, 2, 4, PLANC_RUNTIME)
    assert act.none == pytest.approx(40 * s * b * h + small)
    # in bf16 throughout (FSDP's bf16 parameters, r = e = 2) the linears share one input:
    # 2 r = 4, 2 e = 4, 6, 2, 16 -> 32 s b h
    assert layer_activation_bytes(m, b, 1, False, 2, 2, PLANC_RUNTIME).none == pytest.approx(32 * s * b * h + small)
    # selective keeps: block input r = 4, QKV 6, O 2 + lse, MLP-in output 2 x 4 = 8 (not the
    # output projections' results, which no-recompute does not keep either)
    assert act.selective == pytest.approx((4 + 6 + 2 + 8) * s * b * h + 4 * a * s * b)
    assert act.full == pytest.approx(4 * s * b * h)


def test_sequence_parallel_divides_selective_activations_by_t():
    # Korthikanti et al. 2022, Table 2: with TP + SP, selective recomputation keeps 34 s b h / t --
    # every saved tensor is divided by t, none is replicated (Sec. 4.2.2: the column-parallel
    # linear keeps its 1/t input shard and all-gathers it again in backward). planc's fused-attention
    # block in bf16 (e = r = 2), MHA, GELU f = 4h, selective, TP t with SP keeps per s b h / t:
    #   block input r = 2; QKV 3 e = 6; O e = 2; the two reduce-scatter outputs after the output
    #   projections 2 e = 4; MLP-in output e x 4 = 8  -> 22, plus the fp32 log-sum-exp 4 a s b / t.
    # (Before the fix the two all-gathered sub-layer inputs, 2 r s b h, were kept undivided.)
    m = gpt()
    s, b, h, a = 2048, 1, 1024, 16
    for t in (2, 4, 8):
        act = layer_activation_bytes(m, b, t, True, 2, 2, PLANC_RUNTIME)
        assert act.selective == pytest.approx((22 * s * b * h + 4 * a * s * b) / t)
    # the bug as reported: Llama 3 8B, 32 k context, TP 8, fp32 residual stream under autocast
    # (e = 2, r = 4): SP must keep less than TP alone under selective recomputation, not more
    llama = build_plan(
        {
            "model": {"preset": "llama3-8b", "seq_len": 32768},
            "hardware": {"device": "H100-SXM"},
            "train": {"global_batch": 8},
        }
    ).model
    for r in (2, 4):
        with_sp = layer_activation_bytes(llama, 1, 8, True, 2, r, PLANC_RUNTIME).selective
        without = layer_activation_bytes(llama, 1, 8, False, 2, r, PLANC_RUNTIME).selective
        assert with_sp < without / 2


def test_gqa_shrinks_k_and_v():
    mha, gqa = gpt(), gpt(kv_heads=4)
    # K and V are kv_heads / heads = 1/4 the size of Q: 2 e (1 - 1/4) s b h fewer bytes
    diff = (
        layer_activation_bytes(mha, 1, 1, False, 2, 2, PLANC_RUNTIME).none
        - layer_activation_bytes(gqa, 1, 1, False, 2, 2, PLANC_RUNTIME).none
    )
    assert diff == pytest.approx(2 * 2 * 0.75 * 2048 * 1024)


def test_fsdp_buffers():
    # blocks of 1e6 params, a root unit of 3e6 (embedding 1e6 + head 2e6), bf16 gather, fp32 reduce.
    # ZeRO-3, held through backward: the gathered root 3e6 x 2 B + the head's bf16 gradient 2e6 x 2 B;
    # per block backward: 2 gathered blocks x 2 B + the block's gradients (2 + 4) B
    assert fsdp_gather_bytes(10**6, 3 * 10**6, 2 * 10**6, 3, 2, 4) == (6e6 + 4e6, 2 * 2e6 + 6e6)
    # ZeRO-2 keeps the parameters gathered (counted as the working copy): no gathers here
    assert fsdp_gather_bytes(10**6, 3 * 10**6, 2 * 10**6, 2, 2, 4) == (4e6, 6e6)


def test_fsdp_forward_start_holds_the_roots_all_gather_output_beside_the_first_blocks():
    # blocks of 1e6 params, 4 of them, a root unit of 3e6, bf16 gathers (e = 2).
    # ZeRO-3: the root's all-gather output and its copy 2 x 2 x 3e6 = 12e6, the first block's
    # all-gather output and its copy 2 x 2 x 1e6 = 4e6: 16e6 beyond the sharded states.
    assert fsdp_forward_start_bytes(10**6, 3 * 10**6, 4, 3, 2) == 16e6
    # ZeRO-2 counts every parameter gathered in its states: beyond them the root's all-gather
    # output 2 x 3e6 and the first block's 2 x 1e6, less the 3 blocks not gathered yet 3 x 2 x 1e6.
    assert fsdp_forward_start_bytes(10**6, 3 * 10**6, 4, 2, 2) == 6e6 + 2e6 - 6e6


def test_one_chunk_of_vocabulary_sharded_logits_holds_16_bytes_per_logit():
    # hidden 128, vocabulary 8192, 64 tokens: N = 64 x 8192 / t logits, one chunk (2**26 elements).
    model = gpt(hidden=128, heads=4, vocab=8192, seq_len=64)
    # t = 1: log-softmax's output, its incoming and its outgoing gradient, 3 x 4 bytes per logit
    assert logits_bytes(model, 1, 1, 4) == 12 * 64 * 8192
    # t = 2 (loss_parallel): the saved log-softmax output, the zeroed gradient, exp and their sum,
    # 4 x 4 bytes per local logit, N = 64 x 4096 -- whatever the logits' own dtype
    for e in (2, 4):
        assert logits_bytes(model, 1, 2, e) == 16 * 64 * 4096


def test_peak_is_the_largest_phase_not_the_sum_of_phases():
    from planc.cost.estimate import StageMemory, Term

    s = StageMemory(rank=0, params=10.0, master=0.0, grads=10.0, optimizer=20.0, act_per_layer=5.0, act_layers=4.0)
    s = s.updated(
        extra=(Term("logits and loss", 7.0, "loss"), Term("recompute working set", 2.0, "backward")),
        transient=(Term("FSDP block buffers", 3.0, "backward"), Term("runtime", 1.0)),
    )
    # states 40 + activations 20 + runtime 1 + the larger phase: loss 7 > backward 2 + 3
    assert s.peak_phase == "loss"
    assert s.total == 40 + 20 + 1 + 7
    # a larger backward phase takes over: 2 + 6 > 7
    s = s.updated(transient=(Term("more block buffers", 3.0, "backward"),))
    assert s.peak_phase == "backward" and s.total == 40 + 20 + 1 + 8
    assert s.activations + s.transient_bytes + s.model_states == s.total
