"""Fused-attention rates per device generation, RMSNorm and recomputation-policy traffic, FSDP
under pipelining: hand-derived values (arithmetic in the comments, sources in compute.py)."""

from dataclasses import replace

import pytest

from planc.cost import PLANC_RUNTIME, build_context, evaluate
from planc.cost.compute import (
    Device,
    attention_length_factor,
    block_elementwise_bytes,
    block_gemms,
    block_times,
    device_for,
    fused_attention_rates,
    gemm_seconds,
    head_times,
)
from planc.cost.memory import loss_checkpointed, loss_in_forward, loss_kind
from planc.cost.profile import on_hardware
from planc.planner import choose
from planc.spec import build_plan
from planc.strategies.registry import load_registry


def _plan(device="H100-SXM", nodes=1, **layout):
    return build_plan(
        {
            "model": {"preset": "llama3-8b", "seq_len": 8192},
            "hardware": {"device": device, "nodes": nodes, "per_node": 8},
            "train": {"global_batch": 16 * nodes, "micro_batch": 2 if "pp" not in layout else 1},
            "layout": {"tp": 1, "pp": 1, "dp": 8 * nodes, "zero": 3, "recompute": "selective", **layout},
        }
    )


def test_flash_attention_2_on_hopper_runs_at_its_measured_share_of_the_gemm_rate():
    h100 = device_for(_plan().hardware, "bf16")
    a100 = device_for(_plan("A100-80GB").hardware, "bf16")
    assert (h100.generation, a100.generation) == ("hopper", "ampere")
    # Shah et al. 2024, Figs. 5-6: FA2 forward causal 333, backward 318 TFLOP/s at 8 k on H100,
    # whose best GEMM is 792.1: 0.42 and 0.40 of the GEMM rate (0.68 x 989 TFLOP/s).
    fwd, bwd = fused_attention_rates(h100, "fa2", 8192)
    assert fwd == pytest.approx(0.42 * 0.68 * 989e12)
    assert bwd == pytest.approx(0.40 * 0.68 * 989e12)
    # Ampere: "up to 73%" of peak over the A100's best GEMM, 267.9 / 312: 0.85 of the GEMM rate.
    assert fused_attention_rates(a100, "fa2", 8192)[0] == pytest.approx(0.85 * 0.73 * 312e12)
    # cuDNN's fused attention uses Hopper's instructions: 529 / 792.1 = 0.67; Triton is FA2 / 1.8.
    assert fused_attention_rates(h100, "cudnn", 8192)[0] == pytest.approx(0.67 * 0.68 * 989e12)
    assert fused_attention_rates(h100, "triton", 8192)[0] == pytest.approx(fwd / 1.8)


def test_attention_length_factor_follows_the_measured_curve():
    assert attention_length_factor(8192) == 1.0
    assert attention_length_factor(65536) == 1.0  # constant beyond the last point
    assert attention_length_factor(512) == 0.57
    assert attention_length_factor(128) == 0.57  # constant below the first
    # halfway between 1 k and 2 k in log2: (0.78 + 0.89) / 2
    assert attention_length_factor(round(1024 * 2**0.5)) == pytest.approx(0.835, abs=1e-3)
    cpu = Device(peak=1e12, efficiency=0.5, hbm_bw=1e10, sms=None, generation="cpu")
    assert fused_attention_rates(cpu, "fa2", 512) == (0.72 * 0.5e12, 0.72 * 0.5e12)  # no length curve on CPU


def test_hopper_attention_makes_a_block_slower_than_the_ampere_ratio_predicted():
    plan = _plan()
    device = device_for(plan.hardware, "bf16")
    fa2 = block_times(plan.model, 2, 1, False, device, 2, 2, replace(PLANC_RUNTIME, flash_kernel="fa2"))
    cudnn = block_times(plan.model, 2, 1, False, device, 2, 2, replace(PLANC_RUNTIME, flash_kernel="cudnn"))
    # T = 16384 tokens, causal attention FLOPs 4 T s h / 2 = 2.2e12 forward: at 0.42 vs 0.67 of the
    # GEMM rate the difference is flops (1/0.42 - 1/0.67) / gemm_rate
    flops = 4.0 * 16384 * 8192 * 4096 / 2
    rate = 0.68 * 989e12
    assert fa2.forward - cudnn.forward == pytest.approx(flops / rate * (1 / 0.42 - 1 / 0.67))
    assert fa2.backward - cudnn.backward == pytest.approx(2.5 * flops / rate * (1 / 0.40 - 1 / 0.65))


def test_planc_runs_cudnn_attention_on_hopper_and_the_fused_optimizer_on_both_devices():
    """torch 2.11's SDPA ran cuDNN's kernels on an H100 (docs/gpu.md); planc's AdamW is fused on
    CUDA and on CPU (planc.runtime.optim.runs_fused); another program on CPU runs torch's loop."""
    assert PLANC_RUNTIME.flash_kernel == "cudnn" and PLANC_RUNTIME.optimizer_kernel == "fused"
    assert on_hardware(PLANC_RUNTIME, is_cpu=True).optimizer_kernel == "fused"
    assert on_hardware(replace(PLANC_RUNTIME, name="another program"), is_cpu=True).optimizer_kernel == "foreach"


def test_the_chunked_loss_reruns_its_forward_in_backward_only_where_a_pipeline_holds_sharded_logits():
    """On the last stage of a GPipe or zero-bubble pipeline planc's loss checkpoints each chunk of
    vocabulary-sharded (TP) logits: backward pays the upcast and softmax again. Elsewhere, and on
    plain logits there (their gradient is written over them), it differentiates each chunk in the
    forward: the forward pays the loss's forward and backward, and the backward only scales the
    kept gradient."""
    plan = _plan()
    device = device_for(plan.hardware, "bf16")
    m, T, V = plan.model, 2 * 8192, plan.model.padded_vocab
    assert loss_kind("chunked", pp=1) == "chunked" and loss_kind("chunked", 4, "gpipe", tp=2) == "chunked_recompute"
    assert loss_kind("chunked", 4, "zero-bubble", tp=8) == "chunked_recompute"
    assert loss_kind("chunked", 4, "gpipe") == "chunked" and loss_kind("chunked", 4, "zero-bubble") == "chunked"
    # 1F1B's last stage runs each backward right after its forward: one micro-batch in flight
    assert loss_kind("chunked", 4, "1f1b", tp=2) == "chunked" and loss_kind("chunked", 4, "interleaved", 2) == "chunked"
    assert loss_kind("whole", 4, "gpipe", tp=2) == "whole"
    assert loss_checkpointed(m, 2, 1, "chunked_recompute") and not loss_checkpointed(m, 2, 1, "chunked")
    assert loss_in_forward(m, 2, 1, "chunked") and not loss_in_forward(m, 2, 1, "whole")
    plain = head_times(m, 2, 1, False, device, 2, 2, loss="whole")
    rerun = head_times(m, 2, 1, False, device, 2, 2, loss="chunked_recompute")
    in_forward = head_times(m, 2, 1, False, device, 2, 2, loss="chunked")
    # bf16 logits: upcast (read 2, write 4) and log-softmax (read 4, write 4) = 14 bytes per logit
    assert rerun[0] == plain[0]
    assert rerun[1] - plain[1] == pytest.approx(14 * T * V / device.memory_rate)
    # the loss's backward (14 bytes) moves into the forward; backward reads and writes the bf16 gradient
    assert in_forward[0] - plain[0] == pytest.approx(14 * T * V / device.memory_rate)
    assert plain[1] - in_forward[1] == pytest.approx((14 - 4) * T * V / device.memory_rate)


def test_composite_rmsnorm_moves_r_plus_3e_plus_28_bytes_per_element():
    plan = _plan()
    m, T, h = plan.model, 2 * 8192, 4096
    fused = block_elementwise_bytes(m, T, 1, False, 2, 2, PLANC_RUNTIME)
    composite = block_elementwise_bytes(m, T, 1, False, 2, 2, replace(PLANC_RUNTIME, rms_norm="composite"))
    # two norms: 2 x (2 + 6 + 28) T h instead of 2 x (2 x 2) T h
    assert composite - fused == pytest.approx(2 * (36 - 4) * T * h)


def test_torchtitan_complex_rope_and_repeat_kv_traffic():
    plan = _plan()
    m, T, h, kv = plan.model, 2 * 8192, 4096, 1024  # Llama 3 8B: 8 KV heads of 128
    base = block_elementwise_bytes(m, T, 1, False, 2, 2, PLANC_RUNTIME)
    complex_rope = block_elementwise_bytes(m, T, 1, False, 2, 2, replace(PLANC_RUNTIME, rope_kernel="complex"))
    # planc's RoPE 48 bytes per element of Q and K; torchtitan's complex RoPE 2 + 4 (upcast),
    # 4 + 4 (complex multiply), 4 + 2 (downcast) = 20
    assert base - complex_rope == pytest.approx((48 - 20) * T * (h + kv))
    repeat = block_elementwise_bytes(m, T, 1, False, 2, 2, replace(PLANC_RUNTIME, gqa_repeat=True))
    # repeat_kv copies K and V: each reads 2 kv and writes 2 h bytes per token
    assert repeat - base == pytest.approx(2 * 2 * T * (kv + h))
    fused = replace(PLANC_RUNTIME, fused_elementwise=True)
    fused_repeat = block_elementwise_bytes(m, T, 1, False, 2, 2, replace(fused, gqa_repeat=True))
    assert fused_repeat - block_elementwise_bytes(m, T, 1, False, 2, 2, fused) == pytest.approx(2 * 2 * T * (kv + h))


def test_every_other_mm_policy_reruns_wk_wo_and_the_mlp_second_matmul():
    plan = _plan()
    device = device_for(plan.hardware, "bf16")
    m, T = plan.model, 2 * 8192
    planc = block_times(m, 2, 1, False, device, 2, 2, PLANC_RUNTIME)
    titan = block_times(m, 2, 1, False, device, 2, 2, replace(PLANC_RUNTIME, selective_policy="every-other-mm"))
    gemms = [gemm_seconds(a, b, c, device, 2) for a, b, c in block_gemms(m, T, 1)]
    # block_gemms order: wq, wk, wv, wo, w1, w3, w2; planc reruns wo, torchtitan wk, wo and w3
    assert titan.selective_recompute - planc.selective_recompute == pytest.approx(gemms[1] + gemms[5])
    assert (titan.forward, titan.backward) == (planc.forward, planc.backward)


def test_fsdp_under_pipelining_gathers_once_per_step_with_zero2():
    # torch's PipelineStage keeps FSDP parameters unsharded after each backward: ZeRO-2 gathers
    # once per step, ZeRO-3 once per backward plus the first forward, not twice per micro-batch.
    plan = build_plan(
        {
            "model": {"preset": "llama3-8b", "seq_len": 2048},
            "hardware": {"device": "H100-SXM", "nodes": 2, "per_node": 8},
            "train": {"global_batch": 64, "micro_batch": 1},
            "layout": {"tp": 1, "pp": 2, "dp": 8, "zero": 2, "recompute": "full", "schedule": "1f1b"},
        }
    )
    registry = load_registry()
    choice = choose(plan, registry)
    m = choice.estimate.micro_batches  # 64 / 8 = 8
    assert m == 8
    dp = choice.estimate.comm_of("dp")
    stage_params = max(s.params for s in build_context(plan, choice.layout).stages)
    # one bf16 gather (2 B) and one fp32 reduce-scatter (4 B) of the stage's parameters, x 7/8
    assert dp.volume == pytest.approx(7 / 8 * stage_params * (2 + 4))
    zero3_layout = choice.layout.model_copy(update={"zero": 3})
    zero3 = evaluate(plan, zero3_layout, registry.passes(plan, zero3_layout))
    assert zero3.comm_of("dp").volume == pytest.approx(7 / 8 * stage_params * ((m + 1) * 2 + 4))
    # ... and holds the whole stage's bf16 parameters between micro-batches: the root unit's
    # throughout, the blocks' (resharded after each forward) from their backward on
    kept = {t.name: t.value for s in zero3.stages for t in s.transient}
    blocks = kept["blocks' parameters gathered from their backward on"]
    assert kept["parameters left unsharded between micro-batches"] + blocks == pytest.approx(2 * stage_params, rel=0.05)
