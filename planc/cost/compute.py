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
2. **Attention**: fused (FlashAttention-2 through SDPA, cuDNN, or a Triton FlashAttention) at the
   kernel's measured fraction of the same device's GEMM rate (:data:`FUSED_ATTENTION_EFFICIENCY`,
   per device generation: FlashAttention-2 does not use Hopper's new instructions), scaled by
   :func:`attention_length_factor` for short sequences, skipping the masked half of a causal
   matrix; or materialized (two batched GEMMs over s x s scores, priced by the roofline, the
   softmax and dropout as elementwise traffic).
3. **Elementwise** ops (norms, casts, RoPE, activation, residual adds, dropout): memory-bound,
   bytes read + written over ``hbm_bw x`` :data:`MEMORY_EFFICIENCY`. Eager PyTorch launches one
   kernel per op, each reading and writing its full tensor; fused kernels (Megatron) touch each
   tensor once.

Backward = 2 x forward for GEMMs and elementwise traffic (input-gradient and weight-gradient
GEMMs; Kaplan et al. 2020); fused attention backward runs five matmuls to the forward's two
(2.5 x its FLOPs, Dao 2023), at the kernel's backward rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planc.cost.dispatch import GPU_SECONDS_PER_OP, MICRO_BATCH_OPS, block_ops, combine
from planc.cost.memory import gemm_input_copies, loss_checkpointed, loss_in_forward
from planc.cost.profile import RuntimeProfile
from planc.spec.hardware import HardwareSpec
from planc.spec.hardware_profile import (
    MeasuredRates,
    interpolate_op_cost,
    nearest_attention_rates,
    nearest_gemm_rate,
    op_mode,
)
from planc.spec.model import ModelSpec

#: Streaming kernels reach about this fraction of peak HBM bandwidth (copy/triad benchmarks such
#: as BabelStream run at 85-90% on A100/H100). An assumption, stated.
MEMORY_EFFICIENCY = 0.85

#: Device generation of each preset: which attention kernels reach what (see below).
GENERATION = {
    "V100-32GB": "volta",
    "A100-40GB": "ampere",
    "A100-80GB": "ampere",
    "H100-SXM": "hopper",
    "H200": "hopper",
    "B200": "blackwell",
    "MI300X": "cdna3",
}

#: (forward, backward) rate of a fused attention kernel at long sequences (8 k, causal, head
#: dim 128) as a fraction of the best GEMM rate on the same device; both are burst measurements,
#: so the ratio carries over to planc's sustained GEMM rate (``hardware.efficiency``).
#:
#: - FlashAttention-2 (torch SDPA's flash backend, flash-attn 2) on Ampere: "up to 73% of the
#:   theoretical maximum" in the forward pass (Dao 2023, arXiv 2307.08691, abstract and Sec. 4.1)
#:   over the A100's best GEMM, 267.9 / 312 = 0.859 (MAMF, see the hardware presets): 0.85; the
#:   backward at Hopper's measured backward/forward ratio (below, 318 / 333): 0.81.
#: - FlashAttention-2 on Hopper: it uses none of Hopper's wgmma/TMA instructions and reaches
#:   about 35% of H100 peak (Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, abstract);
#:   their Figs. 5-6 (H100 SXM5, head dim 128): forward causal 333 TFLOP/s and backward 318 at 8 k,
#:   over the H100's best GEMM 792.1 (MAMF): 0.42 and 0.40.
#: - cuDNN fused attention (Transformer Engine, Megatron-Core) on Hopper: 529 and 518 TFLOP/s in
#:   the same figures: 0.67 and 0.65. Elsewhere taken equal to FlashAttention-2 (an assumption).
#: - FlashAttention in Triton (the kernel MPT / llm-foundry call ``attn_impl: triton``):
#:   "FlashAttention-2 is ... 1.3-2.5x faster than FlashAttention in Triton" (Dao 2023, Sec. 4.1):
#:   FlashAttention-2's rate over the geometric midpoint, 1.8.
#:
#: Generations without a measurement (Volta, Blackwell, CDNA3, custom devices) use Ampere's; CPU
#: processes keep 0.72, a rough figure for torch's CPU attention (``planc calibrate`` measures it).
FUSED_ATTENTION_EFFICIENCY = {
    ("fa2", "ampere"): (0.85, 0.81),
    ("fa2", "hopper"): (0.42, 0.40),
    ("cudnn", "ampere"): (0.85, 0.81),
    ("cudnn", "hopper"): (0.67, 0.65),
    ("triton", "ampere"): (0.85 / 1.8, 0.81 / 1.8),
    ("triton", "hopper"): (0.42 / 1.8, 0.40 / 1.8),
    ("fa2", "cpu"): (0.72, 0.72),
    ("cudnn", "cpu"): (0.72, 0.72),
    ("triton", "cpu"): (0.72, 0.72),
}

#: Fused causal attention's rate by sequence length, relative to its rate at 8 k: short sequences
#: pay each row block's setup (load Q, rescale, write O) over fewer key blocks and leave a larger
#: share of half-empty diagonal blocks. From FlashAttention-2's forward, causal, head dim 128 on
#: H100 (Shah et al. 2024, Fig. 5: 191, 260, 298, 319, 333 TFLOP/s at 0.5, 1, 2, 4, 8 k); cuDNN
#: and FlashAttention-3 follow the same curve within a few percent there. Interpolated in
#: log2(s); constant beyond both ends.
ATTENTION_LENGTH_FACTOR = ((512, 0.57), (1024, 0.78), (2048, 0.89), (4096, 0.96), (8192, 1.0))

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
    generation: str = "ampere"
    """Architecture generation, for the fused-attention rates (:data:`GENERATION`)."""
    measured: MeasuredRates | None = None
    """Rates `planc calibrate` measured on this hardware (``hardware.profile``): they replace the
    data-sheet rates above where they cover a kernel."""
    dtype: str = "bf16"
    """The compute precision, to look the measured GEMM and attention rates up."""

    @property
    def gemm_rate(self) -> float:
        return self.peak * self.efficiency

    @property
    def seconds_per_op(self) -> float:
        """Measured host overhead per eager op; without a profile a GPU's typical host cost, a CPU's 0
        (:mod:`planc.cost.dispatch`)."""
        if self.measured is not None:
            return self.measured.seconds_per_op
        return 0.0 if self.sms is None else GPU_SECONDS_PER_OP

    def seconds_per_model_op(self, compute_bytes: int, residual_bytes: int, elements: float) -> float:
        """:attr:`seconds_per_op` for the model's own ops (blocks, embedding, head, loss) whose
        activations hold ``elements`` elements (tokens x hidden / tp), in the plan's precision (bf16
        parameters: bytes 2 and 2; autocast: 2 and 4), as measured at that size and in that mode
        (``op_costs``); else the fp32 figure times the profile's factor for the mode."""
        measured = self.measured
        if measured is None:
            return self.seconds_per_op
        mode = op_mode(compute_bytes, residual_bytes)
        points = measured.op_costs
        if points and all(p.in_mode(mode) > 0 for p in points):
            return interpolate_op_cost(points, elements, mode)
        base = interpolate_op_cost(points, elements) if points else measured.seconds_per_op
        if mode == "fp32":
            return base
        return base * (measured.autocast_host_factor if mode == "autocast" else measured.bf16_host_factor)

    @property
    def memory_rate(self) -> float:
        if self.measured is not None and self.measured.memory_bandwidth:
            return self.measured.memory_bandwidth  # already a sustained rate
        return self.hbm_bw * MEMORY_EFFICIENCY


def device_for(hardware: HardwareSpec, precision: str) -> Device:
    peak = hardware.peak if precision == "bf16" else hardware.peak_fp32
    sms = None if hardware.is_cpu else SM_COUNT.get(hardware.device, DEFAULT_SM_COUNT)
    generation = "cpu" if hardware.is_cpu else GENERATION.get(hardware.device, "ampere")
    return Device(
        peak=peak,
        efficiency=hardware.efficiency,
        hbm_bw=hardware.hbm_bw,
        sms=sms,
        generation=generation,
        measured=hardware.measured,
        dtype=precision,
    )


def attention_length_factor(seq_len: int) -> float:
    """:data:`ATTENTION_LENGTH_FACTOR` at ``seq_len``, interpolated in log2."""
    points = ATTENTION_LENGTH_FACTOR
    if seq_len <= points[0][0]:
        return points[0][1]
    for (s0, f0), (s1, f1) in zip(points, points[1:]):
        if seq_len <= s1:
            w = math.log2(seq_len / s0) / math.log2(s1 / s0)
            return f0 + w * (f1 - f0)
    return points[-1][1]


def fused_attention_rates(device: Device, kernel: str, seq_len: int, head_dim: int = 128) -> tuple[float, float]:
    """(forward, backward) FLOP/s of a fused attention kernel on ``device`` at ``seq_len``.

    A calibrated device's measured SDPA rates at the nearest measured shape win."""
    if device.measured is not None:
        rates = nearest_attention_rates(device.measured.attention, seq_len, head_dim, device.dtype)
        if rates is not None:
            return rates
    fwd, bwd = FUSED_ATTENTION_EFFICIENCY.get(
        (kernel, device.generation), FUSED_ATTENTION_EFFICIENCY[(kernel, "ampere")]
    )
    scale = device.gemm_rate * (1.0 if device.sms is None else attention_length_factor(seq_len))
    return fwd * scale, bwd * scale


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
    """Roofline time of ``batch`` (m x k) @ (k x n) GEMMs (a calibrated device: its measured rate
    at the nearest measured shape, which already holds waves and operand traffic)."""
    flops = 2.0 * m * n * k * batch
    if device.measured is not None:
        rate = nearest_gemm_rate(device.measured.gemm, m, k, n, device.dtype)
        if rate is not None:
            return flops / rate
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
    """What selective recomputation redoes: planc's or torchtitan's op-level policy reruns the whole
    forward through the dispatcher (host ops, on a CPU), computing the elementwise kernels and some
    GEMMs (saved ops return their cached outputs); Megatron's, materialized attention's s x s part
    alone (Korthikanti et al. 2022, Sec. 5)."""
    host_bound: bool = False
    """On a GPU: the host takes longer to queue the block's eager ops than its kernels take to run
    (forward and backward together), so the host's dispatch sets the block's time."""


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


#: PyTorch's composite RMSNorm, ``(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) *
#: weight`` (torch on CPU; torchtitan's Python RMSNorm in 2024): read r + write 4 (upcast),
#: 4 + 4 (pow), 4 (mean), 4 + 4 (scale), 4 + e (downcast), e + e (weight): r + 3e + 28 bytes per
#: element, where the fused kernel reads r and writes r.
COMPOSITE_RMSNORM_FIXED_BYTES = 28


#: planc's ``apply_rope`` in eager PyTorch: upcast to fp32 (read 2, write 4), four multiplies and
#: two adds over half-size views, a stack and a downcast — about 48 bytes read + written per
#: element of Q and K.
ROPE_BYTES_PER_ELEMENT = 48

#: torchtitan's complex-number RoPE in eager PyTorch (``RuntimeProfile.rope_kernel = "complex"``): upcast
#: (read e, write 4), complex multiply (read 4, write 4; the frequencies broadcast from a small
#: table), downcast (read 4, write e): 2e + 16 bytes per element of Q and K.
COMPLEX_ROPE_FIXED_BYTES = 16


def block_elementwise_bytes(
    model: ModelSpec, tokens: int, tp: int, sp: bool, compute_bytes: int, residual_bytes: int, profile: RuntimeProfile
) -> float:
    """HBM bytes read + written by the forward's elementwise kernels of one block.

    Eager PyTorch (T tokens, h_s = h/t under SP else h, e compute bytes, r residual bytes):
    two norms 2 x 2r T h_s (a composite RMSNorm 2 x (r + 3e + 28) T h_s,
    :data:`COMPOSITE_RMSNORM_FIXED_BYTES`); autocast's casts of the GEMM inputs, one per linear
    (:func:`~planc.cost.memory.gemm_input_copies`), (r + e) T h each (none when r = e); RoPE on
    Q and K :data:`ROPE_BYTES_PER_ELEMENT` x T (h + kv)/t (torchtitan's complex RoPE
    (2e + :data:`COMPLEX_ROPE_FIXED_BYTES`) x T (h + kv)/t); a GQA ``repeat_kv`` copy of K and V
    2 e T (kv + h)/t (``gqa_repeat``, fused or not); the contiguous copy of the attention
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
        norm_bytes = 2 * r
        if model.norm == "rmsnorm" and profile.rms_norm == "composite":
            norm_bytes = r + 3 * e + COMPOSITE_RMSNORM_FIXED_BYTES
        norms = 2 * norm_bytes * T * h_s
        attn_copies, mlp_copies = gemm_input_copies(model, e, r)
        casts = (attn_copies + mlp_copies) * (r + e) * T * h if r != e else 0.0
        residual = 2 * (2 * r + e) * T * h_s
        rope_bytes = ROPE_BYTES_PER_ELEMENT if profile.rope_kernel == "planc" else 2 * e + COMPLEX_ROPE_FIXED_BYTES
        rope = rope_bytes * T * (h + kv) / tp if model.position == "rope" else 0.0
        copies = 2 * e * T * h / tp if profile.attention_output_copies > 1 else 0.0
    # repeat_kv: K and V each read at kv and written at h columns (fused or not: the copy stays).
    repeat = 2 * e * T * (kv + h) / tp if profile.gqa_repeat and kv < h else 0.0
    scores = 0.0
    if profile.attention == "materialized":
        scores = (2 * e + ((2 * e + 1) if profile.dropout else 0)) * a * s * T / tp
    return norms + casts + residual + rope + copies + repeat + act + scores


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
    gemm_times = [gemm_seconds(m, k, n, device, compute_bytes) for m, k, n in block_gemms(model, T, tp)]
    gemm = sum(gemm_times)
    if profile.attention == "flash":
        # Causal fused attention computes about half of the s x s blocks.
        flops = 4.0 * T * s * model.heads * model.head_dim / tp * 0.5
        fwd_rate, bwd_rate = fused_attention_rates(device, profile.flash_kernel, s, model.head_dim)
        attn_fwd = flops / fwd_rate
        attn_bwd = 2.5 * flops / bwd_rate
    else:
        d, batch = model.head_dim, b * model.heads // tp
        attn_fwd = gemm_seconds(s, d, s, device, compute_bytes, batch) + gemm_seconds(
            s, s, d, device, compute_bytes, batch
        )
        attn_bwd = 2.0 * attn_fwd
    elementwise = block_elementwise_bytes(model, T, tp, sp, compute_bytes, residual_bytes, profile) / device.memory_rate
    if profile.attention == "flash":
        # planc's policy reruns the attention-out projection (the fourth GEMM); torchtitan's
        # every second one (wk, wo, the MLP's second).
        rerun = gemm_times[1::2] if profile.selective_policy == "every-other-mm" else gemm_times[3:4]
        selective = elementwise + sum(rerun)
    else:  # Megatron reruns the core attention module alone: none of the block's other host ops
        e = compute_bytes
        scores = (2 * e + ((2 * e + 1) if profile.dropout else 0)) * model.heads * s * T / tp
        selective = attn_fwd + scores / device.memory_rate
    per_op = device.seconds_per_model_op(compute_bytes, residual_bytes, T * model.hidden / tp)
    host_fwd, host_bwd = (ops * per_op for ops in block_ops(model))
    cpu = device.sms is None
    kernels_fwd, kernels_bwd = gemm + attn_fwd + elementwise, 2.0 * gemm + attn_bwd + 2.0 * elementwise
    return LayerTimes(
        forward=combine(kernels_fwd, host_fwd, cpu),
        backward=combine(kernels_bwd, host_bwd, cpu),
        backward_weight=gemm,
        selective_recompute=selective + (host_fwd if cpu and profile.attention == "flash" else 0.0),  # GPU: overlapped
        host_bound=not cpu and host_fwd + host_bwd > kernels_fwd + kernels_bwd,
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
    model: ModelSpec,
    micro_batch: int,
    tp: int,
    sp: bool,
    device: Device,
    compute_bytes: int,
    residual_bytes: int,
    loss: str = "chunked",
) -> tuple[float, float]:
    """(forward, backward) of the final norm, output GEMM and cross-entropy on the last stage.

    The loss upcasts the logits to fp32 and runs log-softmax: forward (e + 4) + (4 + 4) bytes per
    logit, backward about the same (softmax gradient, cast back). planc's chunked loss (``loss``,
    :attr:`~planc.cost.profile.RuntimeProfile.loss`, made a layout's by
    :func:`planc.cost.memory.loss_kind`) computes each chunk's gradient in its forward when there is
    more than one chunk (:func:`planc.cost.memory.loss_in_forward`): by hand into one buffer on
    plain logits (28 bytes per bf16 logit), by autograd on DTensor ones (both passes); its backward
    scales the kept gradient (read and write e per logit; under TP the chunks' gradients are also
    concatenated). On vocabulary-sharded logits on the last stage of a GPipe or zero-bubble
    pipeline (``chunked_recompute``) it checkpoints each chunk
    (:func:`planc.cost.memory.loss_checkpointed`), so backward runs the upcast and softmax forward
    again first. (On an H100 that rerun made planc's program 5% slower
    than a plain loop with a whole-logits loss on Llama 3 8B's 128 K vocabulary; computed in the
    forward, 1.4%: docs/gpu.md.)
    ``loss = "fused"`` (a Triton cross-entropy, fp32 in registers) reads the logits forward
    (e per logit) and reads them and writes their gradient backward (2 e).
    """
    T, h, V = model.seq_len * micro_batch, model.hidden, model.padded_vocab
    e, r = compute_bytes, residual_bytes
    h_s = h / tp if sp else h
    gemm = gemm_seconds(T, h, V // tp, device, e)
    loss_forward = ((e + 4) + 8) * T * V / tp if e != 4 else 8.0 * T * V / tp
    loss_backward = (2 if loss_checkpointed(model, micro_batch, tp, loss) else 1) * loss_forward
    if loss_in_forward(model, micro_batch, tp, loss):
        if tp == 1:
            # the gradient worked out by hand into one buffer (planc.runtime.loss._LossWithGradient):
            # float32 copy (e + 4), log-softmax (8), its exponential in place (8), the cast into the
            # buffer (4 + e); backward scales the buffer in place (2 e)
            loss_forward, loss_backward = (2 * e + 24) * T * V, 2 * e * T * V
        else:
            # DTensor chunks differentiated by autograd in the forward; backward scales each chunk's
            # gradient and the split concatenates them (2 e each)
            loss_forward, loss_backward = 2 * loss_forward, 4 * e * T * V / tp
    if loss == "fused":
        loss_forward, loss_backward = e * T * V / tp, 2 * e * T * V / tp
    norm = 2 * r * T * h_s + ((r + e) * T * h_s if r != e else 0.0)
    fwd = gemm + (loss_forward + norm) / device.memory_rate
    bwd = 2.0 * gemm + (loss_backward + 2 * norm) / device.memory_rate
    # The host ops of embedding, head and loss, a third forward and two thirds backward.
    host = MICRO_BATCH_OPS * device.seconds_per_model_op(compute_bytes, residual_bytes, T * h / tp)
    cpu = device.sms is None
    return combine(fwd, host / 3, cpu), combine(bwd, 2 * host / 3, cpu)


#: Thread blocks (hence SMs) NCCL occupies while a collective runs: one per channel, and rings
#: on 8-GPU NVLink/InfiniBand nodes typically run 8-32 channels (NCCL_MIN/MAX_NCHANNELS). We
#: take 16. Overlapped communication is not free: those SMs (and their share of HBM bandwidth)
#: are taken from the GEMMs it hides behind (Rashidi et al. 2021, ISCA, "Enabling
#: Compute-Communication Overlap in Distributed Deep Learning Training Platforms", Sec. 3).
NCCL_SMS = 16


def overlap_contention(device: Device) -> float:
    """Fraction of compute throughput lost while a collective runs underneath it."""
    return 0.0 if device.sms is None else min(1.0, NCCL_SMS / device.sms)
