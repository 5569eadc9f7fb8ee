"""What the program being costed actually does: the implementation choices the formulas depend on.

The cost model prices *a program*, not an abstract layout. Two programs with the same layout
differ in what they keep in memory and how many bytes their kernels move: PyTorch eager with
``scaled_dot_product_attention`` stores no s x s matrix, Megatron-LM 2021 did; torch's pipeline
stages allocate a receive buffer per micro-batch, Megatron's only for the one in flight. A
:class:`RuntimeProfile` names these choices, so every formula states which program it describes.

:data:`PLANC_RUNTIME` is the program planc emits (the default everywhere).
:data:`MEGATRON_LM_2021` is the system of Narayanan et al. 2021, used to check the model
against their published Table 1 (the tests and ``bench/``); it is not a planner option.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model state (ZeRO paper Sec. 5 terms).

    ``working`` is the copy the forward/backward compute with (fp16/bf16 in the paper's mixed
    precision, fp32 when the program keeps fp32 parameters and autocast casts on the fly);
    ``master`` an fp32 master copy kept besides it (0 when the working copy is already fp32);
    ``grads`` the gradients; ``optimizer`` the optimizer's own states (Adam: m and v).
    ZeRO stage 1 shards master + optimizer, stage 2 also grads, stage 3 also the working copy.
    """

    working: float
    master: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.working + self.master + self.grads + self.optimizer


#: ZeRO's mixed-precision Adam (Rajbhandari et al. 2019, Sec. 3.1 and 5): fp16 params (2) and
#: grads (2), and K = 12 bytes of fp32 master params (4), momentum (4) and variance (4).
ZERO_PAPER_MIXED_ADAM = StateBytes(working=2, master=4, grads=2, optimizer=8)


@dataclass(frozen=True)
class RuntimeProfile:
    """Implementation choices of the costed program that change memory or time."""

    name: str
    gpu_only: bool = False
    """The program runs on NVIDIA GPUs alone (Megatron, Transformer Engine): a prediction for a CPU
    plan prices a program that cannot run there (``planc explain --runtime`` warns)."""
    attention: Literal["flash", "materialized"] = "flash"
    """flash: fused attention (SDPA) keeps Q, K, V, O and the row log-sum-exp, never s x s;
    materialized: scores, softmax and its dropout go through HBM (pre-FlashAttention)."""
    flash_kernel: Literal["fa2", "cudnn", "triton"] = "fa2"
    """Which fused attention kernel runs (``attention = "flash"``): FlashAttention-2 (torch SDPA's
    flash backend, flash-attn 2), cuDNN's fused attention (Transformer Engine; torch SDPA on Hopper
    since torch 2.9-2.11), or FlashAttention in Triton. Their rates differ most on Hopper
    (:data:`planc.cost.compute.FUSED_ATTENTION_EFFICIENCY`)."""
    optimizer_kernel: Literal["fused", "foreach"] = "fused"
    """How the optimizer step runs (:data:`planc.cost.optimizer_step.OPTIMIZER_STEP_BYTES`). ``fused``: one
    kernel reads and writes every state once (torch's ``fused=True`` AdamW, which planc's program
    uses on CUDA; apex/Transformer Engine's FusedAdam). ``foreach``: torch's default multi-tensor
    AdamW, a chain of ``_foreach_*`` passes with temporaries, and its single-tensor loop on CPU,
    which runs the same passes tensor by tensor."""
    dropout: bool = False
    """Dropout after attention and MLP (1-byte masks stored, Korthikanti et al. 2022 Sec. 4.1)."""
    fused_elementwise: bool = False
    """Fused LayerNorm / bias-GeLU / bias-dropout-add kernels (Megatron) instead of one eager
    PyTorch kernel per elementwise op."""
    sp_saves_gathered_input: bool = True
    """Under sequence parallelism, the column-parallel linear saves its *all-gathered* input
    (torch DTensor); Megatron keeps the 1/t shard and gathers again in backward
    (Korthikanti et al. 2022, end of Sec. 4.2.2)."""
    attention_output_copies: int = 1
    """Copies of the attention output kept for backward. SDPA's fused kernels (flash, efficient,
    CPU flash) return O as a transposed view of a (b, s, a, d) buffer, so the reshape that feeds
    the output projection is a view and the projection saves that same buffer: one copy
    (measured: ``bench/activation_memory.py``). A kernel returning (b, a, s, d) would add a
    contiguous copy (2)."""
    rms_norm: Literal["fused", "composite"] = "fused"
    """RMSNorm's kernel. ``fused``: ``aten._fused_rms_norm`` (torch on CUDA) saves its input and
    the per-row rstd, as LayerNorm does. ``composite``: torch on CPU runs the decomposition
    (upcast to fp32, pow, mean, rsqrt, multiply), which saves the fp32 upcast of the input and
    the fp32 normalized tensor: 8 bytes per element on top of the output."""
    selective_policy: Literal["planc", "every-other-mm"] = "planc"
    """Which matmuls selective recomputation reruns besides the elementwise kernels. ``planc``:
    the attention-out projection (``planc/strategies/recompute/runtime.py``). ``every-other-mm``:
    torchtitan's op-level policy (``_save_list`` in its ``parallelize_llama.py``, 2024) saves the
    output of every compute op except every second ``aten.mm`` of a block: wk, wo and the MLP's
    second matmul are recomputed. Only the time differs here; the saved bytes are planc's."""
    rope_kernel: Literal["planc", "complex"] = "planc"
    """The eager RoPE kernel chain (time only). ``planc``: planc's ``apply_rope`` (upcast, four
    multiplies and two adds over half-size views, a stack, a downcast). ``complex``: torchtitan's
    ``apply_rotary_emb`` (2024, ``models/llama/model.py``): ``view_as_complex(x.float())``, one
    complex multiply by the broadcast frequencies, ``view_as_real(...).type_as(x)``. Fused
    programs (``fused_elementwise``) run either as one kernel."""
    gqa_repeat: bool = False
    """With grouped-query attention, K and V are copied to every query head before attention
    (torchtitan's ``repeat_kv``: ``expand`` + ``reshape``, a materialized copy) instead of SDPA
    reading the shared heads (time only: under torchtitan's op-level or full recomputation the
    copies are not kept for backward)."""
    loss: Literal["chunked", "whole", "megatron", "fused"] = "chunked"
    """How the cross-entropy holds the logits (:func:`planc.cost.memory.logits_bytes`).
    ``chunked``: planc's loss (``planc/runtime/loss.py``), float32 in chunks under activation
    checkpointing. ``whole``: ``F.cross_entropy(logits.float())`` over all logits at once
    (torchtitan), 12 bytes per logit at its peak (measured, ``bench/loss_memory.py``).
    ``megatron``: Megatron's vocab-parallel cross-entropy over an fp32 copy of the logits, which
    keeps its softmax in that copy: the head's output and 8 bytes of fp32 per logit. ``fused``:
    flash-attn's Triton cross-entropy (llm-foundry's default ``loss_fn: fused_crossentropy``), fp32
    only in registers: it reads the logits once forward, reads them again and writes their
    gradient backward."""
    pp_recv_buffers: Literal["per_microbatch", "in_flight"] = "per_microbatch"
    """torch.distributed.pipelining allocates an activation and a gradient receive buffer for
    *every* micro-batch up front (stage.py ``_setup_forward_recv_info``); Megatron only for those
    in flight."""
    pp_outputs_kept: bool = True
    """torch's pipeline stage keeps each micro-batch's output, data included, from its forward to
    its backward (``fwd_cache``); Megatron frees an output's data once it is sent and runs the
    backward from its ``grad_fn`` alone (``deallocate_output_tensor``)."""
    pp_sends_kept: bool = True
    """torch's multi-stage schedules (``_PipelineScheduleRuntime``: interleaved 1F1B, zero-bubble)
    wait on their sends only at the step's end, and each send's work holds the tensor it sends
    until then (:func:`planc.stages.sends_held`); Megatron frees a sent output's data at once and
    waits on its sends as it goes."""
    pp_p2p_blocking: bool = False
    """Megatron 2021 waits on every pipeline send/receive; torch's schedules post them
    asynchronously, so only the warm-up/cool-down hops sit on the critical path."""
    p2p_scatter_gather: bool = False
    """Send 1/t of a stage boundary tensor per TP rank and all-gather it inside the node
    (Narayanan et al. 2021, Sec. 4.1 'scatter/gather optimization')."""
    dp_overlap: bool = True
    """Data-parallel gradient reduction overlaps the backward pass (torch DDP buckets, FSDP)."""
    distributed_optimizer: bool = False
    """ZeRO-1 as Megatron-Core's distributed optimizer runs it (``--use-distributed-optimizer
    --overlap-grad-reduce --overlap-param-gather``): the gradients are *reduce-scattered* in buckets
    during the backward, each rank receiving the shard it updates, and the updated parameters are
    all-gathered in the same buckets during the next forward, each bucket waited for by the first
    module that uses it -- 2 Psi of traffic, as ZeRO Sec. 7.2 counts it, mostly hidden. torch's
    ``ZeroRedundancyOptimizer`` (planc's program) all-reduces the gradients and broadcasts the
    parameters after the step instead (:mod:`planc.strategies.zero1.cost_pass`)."""
    recompute_early_stop: bool = False
    """Full recomputation stops once the tensors backward needs are back: torch's non-reentrant
    ``checkpoint`` (planc's program, torchtitan, llm-foundry) does by default
    (``set_checkpoint_early_stop``), so a block's last forward collective under TP, whose output
    backward never reads, is not rerun (``planc verify``: 2 all-gathers and 1 reduce-scatter per
    recomputed block under SP, not 2 and 2). Megatron-LM's reentrant checkpoint reruns the whole
    forward of the layer."""
    ddp_bucket_copy: bool = False
    """Whether DDP holds a second, flat copy of every gradient in its buckets (torch's default
    ``gradient_as_bucket_view=False``). planc's ``ddp`` sets ``gradient_as_bucket_view=True``, so the
    gradients live in the buckets; Megatron reduces its contiguous grad buffer."""
    state_bytes: StateBytes | None = None
    """Fixed per-parameter state bytes; ``None`` derives them from precision and ZeRO stage as
    planc's runtime does (see :func:`planc.cost.memory.runtime_state_bytes`)."""
    residual_bytes: int | None = None
    """Bytes per element of the residual stream; ``None``: fp32 under autocast (fp32 params),
    bf16 under FSDP's bf16 parameters."""

    @property
    def torch_data_parallel(self) -> bool:
        """Whether data parallelism is torch's own wrappers, as in planc's program (DDP or FSDP2's
        ``replicate``, ``ZeroRedundancyOptimizer``): the profiles that derive their state bytes as
        planc's runtime does. Another runtime's profile (Megatron-LM's contiguous grad buffer and
        bucketed distributed optimizer) fixes them."""
        return self.state_bytes is None


#: The program planc emits: PyTorch eager, SDPA (flash) attention, no dropout, autocast bf16
#: (fp32 params) for DDP/ZeRO-1 and FSDP2 MixedPrecisionPolicy(bf16 params, fp32 reduce) for
#: ZeRO-2/3, torch.distributed.pipelining schedules, DTensor tensor/sequence parallelism, fused
#: AdamW on CUDA. SDPA's kernel on Hopper is cuDNN's: torch prefers it on sm90 once its bundled
#: cuDNN is new enough (pytorch/pytorch#162073; torch 2.11 on an H100 ran
#: ``cudnn_generated_fort_native_sdpa_sm90_flash_*`` kernels, docs/gpu.md); elsewhere the
#: "cudnn" rates are FlashAttention-2's.
PLANC_RUNTIME = RuntimeProfile(
    name="planc runtime (PyTorch eager, SDPA)", flash_kernel="cudnn", recompute_early_stop=True
)

#: The same program on CPU processes: torch has no fused RMSNorm kernel there. Its AdamW is fused
#: there too (planc.runtime.optim.runs_fused; torch's default on CPU, which other programs run, is
#: the single-tensor loop: ``fused`` and ``foreach`` default to CUDA tensors only).
PLANC_RUNTIME_CPU = replace(PLANC_RUNTIME, name="planc runtime on CPU (PyTorch eager, SDPA)", rms_norm="composite")


def on_hardware(profile: RuntimeProfile, is_cpu: bool) -> RuntimeProfile:
    """``profile`` as it runs on the plan's devices: on CPU, PyTorch's CPU kernels."""
    if not is_cpu:
        return profile
    if profile == PLANC_RUNTIME:
        return PLANC_RUNTIME_CPU
    adapted = replace(profile, rms_norm="composite", optimizer_kernel="foreach")
    # An adapted profile comes back as the same object, so that build_context reuses the
    # ContextCache that holds it (an equal copy made it build a new cache for every layout).
    return profile if adapted == profile or profile == PLANC_RUNTIME_CPU else adapted


#: Megatron-LM as run for Narayanan et al. 2021 (arXiv 2104.04473): fp16 mixed precision with
#: fp32 master weights and fp32 main grads (2 + 4 + 4 + 8 bytes), fused kernels, softmax over
#: materialized scores with dropout, blocking p2p with the scatter/gather optimization, gradient
#: all-reduce after the backward pass.
MEGATRON_LM_2021 = RuntimeProfile(
    name="Megatron-LM 2021 (Narayanan et al.)",
    gpu_only=True,
    loss="megatron",
    attention="materialized",
    dropout=True,
    fused_elementwise=True,
    sp_saves_gathered_input=False,
    attention_output_copies=1,
    pp_recv_buffers="in_flight",
    pp_outputs_kept=False,
    pp_sends_kept=False,
    pp_p2p_blocking=True,
    p2p_scatter_gather=True,
    dp_overlap=False,
    state_bytes=StateBytes(working=2, master=4, grads=4, optimizer=8),
    residual_bytes=2,
)


#: Megatron-Core with Transformer Engine as NVIDIA benchmarked it on H100 in 2024 (Megatron-LM
#: README at f2e5db4, r0.8.0): bf16 with fp32 main grads and the distributed optimizer, fused
#: kernels, fused (cuDNN) attention, sequence parallelism that keeps the 1/t shard, pipeline
#: buffers for the micro-batches in flight and non-blocking p2p, the distributed optimizer's
#: gradient reduce-scatter and parameter all-gather overlapped with compute (the README's scaling
#: runs pass ``--overlap-grad-reduce --overlap-param-gather``), dropout 0.1 (Megatron's default).
#: Its overlap of tensor-parallel communication with GEMMs (``--tp-comm-overlap``) is not modelled.
MEGATRON_CORE_2024 = RuntimeProfile(
    name="Megatron-Core 2024 (Transformer Engine, H100)",
    gpu_only=True,
    loss="megatron",
    attention="flash",
    flash_kernel="cudnn",
    dropout=True,
    fused_elementwise=True,
    sp_saves_gathered_input=False,
    pp_recv_buffers="in_flight",
    pp_outputs_kept=False,
    pp_sends_kept=False,
    pp_p2p_blocking=False,
    p2p_scatter_gather=False,
    dp_overlap=True,
    distributed_optimizer=True,
    state_bytes=StateBytes(working=2, master=4, grads=4, optimizer=8),
    residual_bytes=2,
)


#: Profiles `planc explain --runtime NAME` can predict for. Only "planc" can be compiled and run;
#: the others answer "what would this layout do in that framework" (e.g. to compare with a
#: published run).
PROFILES: dict[str, RuntimeProfile] = {
    "planc": PLANC_RUNTIME,
    "megatron-lm-2021": MEGATRON_LM_2021,
    "megatron-core-2024": MEGATRON_CORE_2024,
}
