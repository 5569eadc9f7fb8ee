"""Compute time of one transformer block, the embedding and the head, per micro-batch.

A block's time is the sum of three kinds of kernel (a roofline per kernel, Williams et al. 2009):

1. **GEMMs** (QKV, attention-out, MLP, head): ``2 M N K / (peak x efficiency x waves)``, or the
   time to move their operands through HBM if that is longer. ``efficiency`` is the device's
   sustained large-GEMM efficiency (``hardware.efficiency``, see docs/cost-model.md for its
   sources). ``waves`` models tile and wave quantization (NVIDIA, "Matrix Multiplication
   Background", Sec. 'Dimension quantization'; Anthony et al. 2024, arXiv 2401.14489, Sec. 4):
   the output is cut into tiles, the tiles run in waves of one tile per SM, and the last wave
   is partly empty — so small matrices (small hidden size, TP-sharded widths, a micro-batch of
   short sequences) run below the device's best rate. cuBLAS picks among tile shapes; we take
   the best of 256x128, 128x256 and 128x128.
2. **Attention**: fused (SDPA/FlashAttention-2) at :data:`FLASH_RELATIVE_EFFICIENCY` of the GEMM
   rate, skipping the masked half of a causal matrix; or materialized (two batched GEMMs over
   s x s scores, priced by the roofline, the softmax and dropout as elementwise traffic).
3. **Elementwise** ops (norms, casts, RoPE, activation, residual adds, dropout): memory-bound,
   bytes read + written over ``hbm_bw x`` :data:`MEMORY_EFFICIENCY`. Eager PyTorch launches one
   kernel per op, each reading and writing its full tensor; fused kernels (Megatron) touch each
   tensor once.

Backward = 2 x forward for GEMMs and elementwise traffic (input-gradient and weight-gradient
GEMMs; Kaplan et al. 2020); fused attention backward = 2.5 x its forward (FlashAttention-2's
backward runs five matmuls to the forward's two).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planc.cost.memory import gemm_input_copies
from planc.cost.profile import RuntimeProfile
from planc.spec.hardware import HardwareSpec
from planc.spec.model import ModelSpec

#: Streaming kernels reach about this fraction of peak HBM bandwidth (copy/triad benchmarks such
#: as BabelStream run at 85-90% on A100/H100). An assumption, stated.
MEMORY_EFFICIENCY = 0.85

#: FlashAttention-2 reaches 50-73% of A100 peak in the forward pass (Dao 2023, arXiv 2307.08691,
#: Sec. 4.1), against ~86% for the best cuBLAS GEMM (the A100 MAMF, see docs): midpoint ratio
#: 0.62 / 0.86 = 0.72 of the GEMM rate.
FLASH_RELATIVE_EFFICIENCY = 0.72

#: Streaming multiprocessors (compute units) per device, for wave quantization. Vendor data
#: sheets / whitepapers: A100 108 SMs, H100 SXM5 132, B200 148 (2 dies x 74), V100 80,
#: MI300X 304 CUs. A custom device without an entry is treated as 108 SMs.
SM_COUNT = {
    "V100-32GB": 80,
    "A100-40GB": 108,
    "A100-80GB": 108,
    "H100-SXM": 132,
    "H200": 132,
    "B200": 148,
    "MI300X": 304,
}
DEFAULT_SM_COUNT = 108
_TILES = ((256, 128), (128, 256), (128, 128))


@dataclass(frozen=True)
class Device:
    """The rates one device computes with, for the plan's precision."""

    peak: float
    """Dense peak FLOP/s at the compute precision (bf16 tensor cores, or fp32)."""
    efficiency: float
    """Sustained fraction of ``peak`` for large, well-shaped GEMMs."""
    hbm_bw: float
    """Memory bandwidth, bytes/s."""
    sms: int | None
    """Compute units, for wave quantization (None: CPU, no waves)."""

    @property
    def gemm_rate(self) -> float:
        return self.peak * self.efficiency

    @property
    def memory_rate(self) -> float:
        return self.hbm_bw * MEMORY_EFFICIENCY


def device_for(hardware: HardwareSpec, precision: str) -> Device:
    peak = hardware.peak if precision == "bf16" else hardware.peak_fp32
    sms = None if hardware.is_cpu else SM_COUNT.get(hardware.device, DEFAULT_SM_COUNT)
    return Device(peak=peak, efficiency=hardware.efficiency, hbm_bw=hardware.hbm_bw, sms=sms)


def wave_efficiency(m: int, n: int, sms: int | None, batch: int = 1) -> float:
    """Fraction of a GEMM's waves that do useful work: W / ceil(W), W = output tiles / SMs.

    The best over the tile shapes cuBLAS chooses from; a batched GEMM's tiles share the waves.
    1.0 for CPUs (no waves).
    """
    if sms is None:
        return 1.0
    best = 0.0
    for tm, tn in _TILES:
        waves = batch * math.ceil(m / tm) * math.ceil(n / tn) / sms
        best = max(best, waves / math.ceil(waves))
    return best


def gemm_seconds(m: int, k: int, n: int, device: Device, elem_bytes: int, batch: int = 1) -> float:
    """Roofline time of ``batch`` (m x k) @ (k x n) GEMMs."""
    flops = 2.0 * m * n * k * batch
    compute = flops / (device.gemm_rate * wave_efficiency(m, n, device.sms, batch))
    traffic = batch * elem_bytes * (m * k + k * n + m * n) / device.memory_rate
    return max(compute, traffic)


@dataclass(frozen=True)
class LayerTimes:
    """Seconds one block takes on one device for one micro-batch."""

    forward: float
    backward: float
    """Input-gradient + weight-gradient pass."""
    backward_weight: float
    """The weight-gradient GEMMs alone (the W pass of zero-bubble schedules)."""
    selective_recompute: float
    """What selective recomputation redoes: the elementwise kernels and the attention-out GEMM
    (planc's op-level policy) or, for materialized attention, the s x s part (Korthikanti et
    al. 2022, Sec. 5)."""


def block_gemms(model: ModelSpec, tokens: int, tp: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of the forward GEMMs of one block on one TP rank."""
    h, f, kv = model.hidden, model.ffn, model.kv_dim
    # planc's block: separate wq, wk, wv (Q has h columns, K and V kv_heads x head_dim each).
    gemms = [(tokens, h, h // tp), (tokens, h, kv // tp), (tokens, h, kv // tp), (tokens, h // tp, h)]
    if model.mlp == "gelu":
        gemms += [(tokens, h, f // tp), (tokens, f // tp, h)]
    else:
        gemms += [(tokens, h, f // tp), (tokens, h, f // tp), (tokens, f // tp, h)]
    return gemms


#: planc's ``apply_rope`` in eager PyTorch: upcast to fp32 (read 2, write 4), four multiplies and
#: two adds over half-size views, a stack and a downcast — about 48 bytes read + written per
#: element of Q and K.
ROPE_BYTES_PER_ELEMENT = 48


def block_elementwise_bytes(
    model: ModelSpec, tokens: int, tp: int, sp: bool, compute_bytes: int, residual_bytes: int, profile: RuntimeProfile
) -> float:
    """HBM bytes read + written by the forward's elementwise kernels of one block.

    Eager PyTorch (T tokens, h_s = h/t under SP else h, e compute bytes, r residual bytes):
    two norms 2 x 2r T h_s; autocast's casts of the GEMM inputs, one per linear
    (:func:`~planc.cost.memory.gemm_input_copies`), (r + e) T h each (none when r = e); RoPE on
    Q and K :data:`ROPE_BYTES_PER_ELEMENT` x T (h + kv)/t; the contiguous copy of the attention
    output 2 e T h/t; two residual adds 2 x (2r + e) T h_s; GELU 2 e T f/t or SwiGLU's SiLU and
    product 5 e T f/t. Fused (Megatron): LayerNorm 2 x 2e T h_s; bias-dropout-add
    2 x (3e + 1) T h_s; bias-GeLU 2 e T f/t; scale-mask-softmax and its dropout over the scores
    (2e + 2e + 1) a s T / t.
    """
    h, f, kv, a, s = model.hidden, model.ffn, model.kv_dim, model.heads, model.seq_len
    e, r, T = compute_bytes, residual_bytes, tokens
    h_s = h / tp if sp else h
    act = (2 if model.mlp == "gelu" else 5) * e * T * f / tp
    if profile.fused_elementwise:
        norms = 2 * 2 * e * T * h_s
        residual = 2 * (3 * e + (1 if profile.dropout else 0)) * T * h_s
        act = (2 if model.mlp == "gelu" else 3) * e * T * f / tp
        rope = 4 * e * T * (h + kv) / tp if model.position == "rope" else 0.0
        copies = 0.0
        casts = 0.0
    else:
        norms = 2 * 2 * r * T * h_s
        attn_copies, mlp_copies = gemm_input_copies(model, e, r)
        casts = (attn_copies + mlp_copies) * (r + e) * T * h if r != e else 0.0
        residual = 2 * (2 * r + e) * T * h_s
        rope = ROPE_BYTES_PER_ELEMENT * T * (h + kv) / tp if model.position == "rope" else 0.0
        copies = 2 * e * T * h / tp if profile.attention_output_copies > 1 else 0.0
    scores = 0.0
    if profile.attention == "materialized":
        scores = (2 * e + ((2 * e + 1) if profile.dropout else 0)) * a * s * T / tp
    return norms + casts + residual + rope + copies + act + scores


def block_times(
    model: ModelSpec,
    micro_batch: int,
    tp: int,
    sp: bool,
    device: Device,
    compute_bytes: int,
    residual_bytes: int,
    profile: RuntimeProfile,
) -> LayerTimes:
    """Forward and backward seconds of one block on one device for one micro-batch."""
    s, b = model.seq_len, micro_batch
    T = s * b
    gemm = sum(gemm_seconds(m, k, n, device, compute_bytes) for m, k, n in block_gemms(model, T, tp))
    if profile.attention == "flash":
        # Causal fused attention computes about half of the s x s blocks.
        flops = 4.0 * T * s * model.heads * model.head_dim / tp * 0.5
        attn_fwd = flops / (device.gemm_rate * FLASH_RELATIVE_EFFICIENCY)
        attn_bwd = 2.5 * attn_fwd
    else:
        d, batch = model.head_dim, b * model.heads // tp
        attn_fwd = gemm_seconds(s, d, s, device, compute_bytes, batch) + gemm_seconds(
            s, s, d, device, compute_bytes, batch
        )
        attn_bwd = 2.0 * attn_fwd
    elementwise = block_elementwise_bytes(model, T, tp, sp, compute_bytes, residual_bytes, profile) / device.memory_rate
    if profile.attention == "flash":
        h, h_q = model.hidden, model.heads * model.head_dim
        selective = elementwise + gemm_seconds(T, h_q // tp, h, device, compute_bytes)
    else:
        e = compute_bytes
        scores = (2 * e + ((2 * e + 1) if profile.dropout else 0)) * model.heads * s * T / tp
        selective = attn_fwd + scores / device.memory_rate
    return LayerTimes(
        forward=gemm + attn_fwd + elementwise,
        backward=2.0 * gemm + attn_bwd + 2.0 * elementwise,
        backward_weight=gemm,
        selective_recompute=selective,
    )


def embedding_times(
    model: ModelSpec, micro_batch: int, tp: int, device: Device, residual_bytes: int
) -> tuple[float, float]:
    """(forward, backward) of the embedding lookup: memory-bound.

    Forward gathers T rows and writes them (2 r T h; learned positions add 3 r T h). Backward
    scatters T rows into the dense (V/t x h) fp32 gradient and accumulates it into ``.grad``
    (read + write: 12 V h / t).
    """
    T, h = model.seq_len * micro_batch, model.hidden
    r = residual_bytes
    fwd = (2 + (3 if model.position == "learned" else 0)) * r * T * h
    bwd = 2 * r * T * h + 12.0 * model.padded_vocab * h / tp
    return fwd / device.memory_rate, bwd / device.memory_rate


def head_times(
    model: ModelSpec, micro_batch: int, tp: int, sp: bool, device: Device, compute_bytes: int, residual_bytes: int
) -> tuple[float, float]:
    """(forward, backward) of the final norm, output GEMM and cross-entropy on the last stage.

    The loss upcasts the logits to fp32 and runs log-softmax: forward (e + 4) + (4 + 4) bytes
    per logit, backward about the same (softmax gradient, cast back).
    """
    T, h, V = model.seq_len * micro_batch, model.hidden, model.padded_vocab
    e, r = compute_bytes, residual_bytes
    h_s = h / tp if sp else h
    gemm = gemm_seconds(T, h, V // tp, device, e)
    loss = ((e + 4) + 8) * T * V / tp if e != 4 else 8.0 * T * V / tp
    norm = 2 * r * T * h_s + ((r + e) * T * h_s if r != e else 0.0)
    fwd = gemm + (loss + norm) / device.memory_rate
    bwd = 2.0 * gemm + (loss + 2 * norm) / device.memory_rate
    return fwd, bwd


#: Bytes per parameter the optimizer step reads and writes (fp32): AdamW reads param, grad,
#: m, v and writes param, m, v (7 x 4 = 28); SGD with momentum 5 x 4 = 20; gradient-norm
#: clipping reads the gradients once more (4).
OPTIMIZER_STEP_BYTES = {"adam": 32, "adamw": 32, "sgd": 24}


def optimizer_step_seconds(params: float, optimizer: str, device: Device) -> float:
    """Memory-bound optimizer step over ``params`` parameters held by this device."""
    return OPTIMIZER_STEP_BYTES[optimizer] * params / device.memory_rate


#: Thread blocks (hence SMs) NCCL occupies while a collective runs: one per channel, and rings
#: on 8-GPU NVLink/InfiniBand nodes typically run 8-32 channels (NCCL_MIN/MAX_NCHANNELS). We
#: take 16. Overlapped communication is not free: those SMs (and their share of HBM bandwidth)
#: are taken from the GEMMs it hides behind (Rashidi et al. 2021, ISCA, "Enabling
#: Compute-Communication Overlap in Distributed Deep Learning Training Platforms", Sec. 3).
NCCL_SMS = 16


def overlap_contention(device: Device) -> float:
    """Fraction of compute throughput lost while a collective runs underneath it."""
    return 0.0 if device.sms is None else min(1.0, NCCL_SMS / device.sms)
