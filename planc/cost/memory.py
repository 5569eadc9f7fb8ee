"""Memory per device: model states (ZeRO), activations (Korthikanti), and fixed overheads.

Every function is pure and returns bytes. Symbols follow the papers: Psi parameters, N_d the
data-parallel degree, s sequence length, b micro-batch, h hidden, a heads, t tensor-parallel
degree, L layers, p pipeline stages, v virtual stages (model chunks per rank), m micro-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

from planc.cost.profile import RuntimeProfile, StateBytes
from planc.spec.model import ModelSpec
from planc.stages import StageStyle

if TYPE_CHECKING:
    from planc.spec.plan import Plan

GiB = 2**30

# -- model states (ZeRO paper, Sec. 5) ---------------------------------------------------------

#: Bytes per parameter of the optimizer's own states (fp32): Adam/AdamW keep the first and
#: second moments (Kingma & Ba 2015, Alg. 1): 4 + 4; SGD with momentum one buffer: 4.
OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "sgd": 4}


def ddp_replicates(plan: Plan) -> bool:
    """The ``ddp`` option ``bf16_weights`` as the plan sets it (default true): whether bf16 DDP runs
    FSDP2's ``replicate`` (false: ``DistributedDataParallel`` under autocast, for comm hooks)."""
    return all(use.options.get("bf16_weights", True) is not False for use in plan.uses if use.name == "ddp")


def bf16_weights(precision: str, zero: int, dp: int, replicate: bool = True) -> bool:
    """Whether the program computes with bf16 copies of fp32 parameters (FSDP2's
    ``MixedPrecisionPolicy``) rather than ``torch.autocast`` over fp32 parameters.

    bf16 with data parallelism: ZeRO-2/3 (``fully_shard``) and DDP (``replicate``, FSDP2's
    replicate-only wrapper, unless ``replicate`` is false: :func:`ddp_replicates`) take the
    policy. ZeRO-1 keeps ``DistributedDataParallel`` + ``ZeroRedundancyOptimizer`` (which
    broadcasts plain tensors and cannot take replicate's DTensors) under autocast, and so does a
    layout without data parallelism (nothing wraps it).
    """
    return precision == "bf16" and (zero >= 2 or (zero == 0 and dp > 1 and replicate))


def runtime_state_bytes(precision: str, optimizer: str, zero: int, dp: int = 1, replicate: bool = True) -> StateBytes:
    """Per-parameter bytes of the model states in planc's runtime, and why.

    - fp32; bf16 under autocast (ZeRO-1, or no data parallelism; see :func:`bf16_weights`):
      parameters stay fp32 and are the working copy (4), no separate master (0), fp32 grads (4).
      Autocast's transient bf16 weight copies are the ``bf16`` strategy's term, not a state.
    - bf16 with DDP (``replicate`` + MixedPrecisionPolicy): the replicated fp32 parameters act
      as master (4), the bf16 compute copies live from forward to the end of backward (2),
      fp32 grads (4); nothing is sharded.
    - bf16 with ZeRO 2 (FSDP2, ``reshard_after_forward=False``, MixedPrecisionPolicy(param bf16,
      reduce fp32)): the sharded fp32 parameters act as master (4, sharded), the unsharded bf16
      parameters stay gathered from forward to backward (2, not sharded), fp32 sharded grads (4).
    - bf16 with ZeRO 3 (FSDP2, reshard after forward): only the sharded fp32 parameters persist
      (master 4); the gathered bf16 copy of one or two blocks is transient (see
      :func:`fsdp_gather_bytes`), so the working copy counts 0 here.
    - fp32 with ZeRO 2: as bf16 but the unsharded working copy is fp32 (4).

    The optimizer adds :data:`OPTIMIZER_STATE_BYTES`. Totals for Adam: 16 B/param under autocast
    or fp32, 18 with bf16 compute copies (DDP; ZeRO-2, whose 2 are the only unsharded bytes).
    """
    opt = OPTIMIZER_STATE_BYTES[optimizer]
    if zero == 0 and bf16_weights(precision, zero, dp, replicate):
        return StateBytes(working=2, master=4, grads=4, optimizer=opt)
    if zero <= 1:
        return StateBytes(working=4, master=0, grads=4, optimizer=opt)
    working = 0 if zero == 3 else (2 if precision == "bf16" else 4)
    return StateBytes(working=working, master=4, grads=4, optimizer=opt)


class ModelStates(NamedTuple):
    """Per-device bytes of the model states, split as the ZeRO paper splits them."""

    params: float
    """Working copy of the parameters (plus nothing else)."""
    master: float
    """fp32 master copy of the parameters, if kept separately."""
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.master + self.grads + self.optimizer


def model_state_bytes(psi: float, n_d: int, zero: int, per_param: StateBytes) -> ModelStates:
    """Model-state memory per device (Rajbhandari et al. 2019, Sec. 5, Figure 1).

    With K the optimizer-state multiplier (master + optimizer bytes):

    - baseline DP:          (2 + 2 + K) Psi
    - P_os   (ZeRO-1):      2 Psi + 2 Psi + K Psi / N_d
    - P_os+g (ZeRO-2):      2 Psi + (2 + K) Psi / N_d
    - P_os+g+p (ZeRO-3):    (2 + 2 + K) Psi / N_d

    written here for any :class:`StateBytes` (the paper's mixed-precision Adam is
    ``working=2, grads=2, master+optimizer=12``). ``psi`` is the parameter count on this device
    *after* tensor/pipeline sharding; ZeRO then divides over the ``n_d`` data-parallel ranks.
    """
    n = max(1, n_d)
    os_shard = n if zero >= 1 else 1  # P_os: optimizer states (with the fp32 master)
    g_shard = n if zero >= 2 else 1  # P_g: gradients
    p_shard = n if zero >= 3 else 1  # P_p: parameters
    return ModelStates(
        per_param.working * psi / p_shard,
        per_param.master * psi / os_shard,
        per_param.grads * psi / g_shard,
        per_param.optimizer * psi / os_shard,
    )


# -- activations (Korthikanti et al. 2022, Table 2, adapted) -----------------------------------


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one transformer block keeps for backward, per micro-batch, on one device."""

    none: float
    """No recomputation: everything autograd saves."""
    selective: float
    """Selective recomputation (see :func:`layer_activation_bytes`)."""
    full: float
    """Full recomputation: only the block's input is kept."""

    def under(self, recompute: str) -> float:
        """The bytes for a layout's ``recompute`` ("none", "selective" or "full")."""
        return {"none": self.none, "selective": self.selective, "full": self.full}[recompute]


def gemm_input_copies(model: ModelSpec, compute_bytes: int, residual_bytes: int) -> tuple[int, int]:
    """How many copies of the attention and MLP inputs the block's GEMMs save.

    planc's block runs separate wq, wk, wv (and SwiGLU's w1, w3) linears on one normed input.
    Under ``torch.autocast`` that input is fp32 (the residual stream is), and autocast casts it
    to bf16 once *per linear*, each linear saving its own copy: 3 for attention, 1 (GELU) or 2
    (SwiGLU) for the MLP. When the input already has the compute dtype the linears share it.
    """
    if residual_bytes == compute_bytes:
        return 1, 1
    return 3, (1 if model.mlp == "gelu" else 2)


def layer_activation_bytes(
    model: ModelSpec, b: int, tp: int, sp: bool, compute_bytes: int, residual_bytes: int, profile: RuntimeProfile
) -> LayerActivations:
    """Activation bytes of one block for one micro-batch (Korthikanti et al. 2022, Table 2).

    Korthikanti's count for a GPT block with dropout and materialized attention, 16-bit, is
    ``s b h (34 + 5 a s / h)`` without parallelism, ``s b h (10 + 24/t + 5 a s/(h t))`` with TP
    and ``s b h (34/t + 5 a s/(h t))`` with TP + SP. We rebuild it term by term, so the same
    code covers planc's model: pre-norm blocks, GELU or SwiGLU, GQA, no dropout, and fused SDPA
    attention (no s x s matrix: Q, K, V, the output O and the fp32 row log-sum-exp).

    With e = compute bytes, r = residual-stream bytes, g = kv_heads / heads, T = s b tokens and
    h_s = h/t under SP (else h), the saved tensors are:

    - norms: their inputs, 2 r T h_s (the residual stream; fp32 under autocast), and per-row
      statistics, 2 x 8 bytes per token row (LayerNorm's mean and rstd; RMSNorm's rstd).
      PyTorch's composite RMSNorm (``profile.rms_norm``: CPU) instead saves the fp32 upcast of
      its input and the fp32 normalized tensor: 2 x 8 T h_s;
    - inputs of the QKV and MLP-in GEMMs (norm outputs), e T h each, times
      :func:`gemm_input_copies` — replicated under TP; under SP torch saves the all-gathered
      tensor (``sp_saves_gathered_input``), Megatron the 1/t shard and gathers again;
    - Q, K, V: e T h (1 + 2g) / t. In fp32, planc repeats the kv heads before SDPA (its fused
      kernels take unequal head counts only in 16-bit), and SDPA saves the repeated K and V:
      e T h (1 + 2) / t;  attention output O: copies x e T h / t;
    - flash: log-sum-exp 4 T a / t;  materialized: scores softmax (e), dropout mask (1) and
      dropout output (e) over a s^2 b / t elements — Korthikanti's 5 a s^2 b;
    - MLP: GELU: its input and output, 2 e T f / t; SwiGLU: gate, up, silu(gate), product,
      4 e T f / t;
    - dropout masks (1 byte) after attention and MLP: 2 T h_s.

    Selective recomputation: for materialized attention, Korthikanti's (recompute the s^2
    part). For fused attention there is no s^2 part; planc's policy (op-level activation
    checkpointing, ``planc.strategies.recompute.runtime``) keeps the outputs of the QKV and
    MLP-in matmuls, of attention and of the reducing TP collectives, and recomputes norms, casts,
    RoPE, activation functions, the attention-out matmul and SP's all-gathers: block input
    r T h_s; QKV output e T h (1 + 2g) / t; O and the log-sum-exp; under TP the outputs of the
    two collectives after the output projections, e T h_s each; the MLP-in output(s) e T f / t.
    The output projections' own matmul outputs (unreduced partial sums under TP) are not kept:
    no-recompute never keeps them either. Under SP every term is divided by t, as in
    Korthikanti's Table 2 (34/t): the all-gathered norm outputs (r T h each, t times a shard)
    are gathered again in backward instead of kept (their Sec. 4.2.2).

    Full recomputation keeps the block input only: r T h_s (Korthikanti Table 2: 2 s b h / t
    with SP).
    """
    s, h, a, f = model.seq_len, model.hidden, model.heads, model.ffn
    T = s * b
    e, r = compute_bytes, residual_bytes
    g = model.kv_heads / model.heads
    h_s = h / tp if sp else h
    rows = T / tp if sp else T
    gemm_in = h / tp if (sp and not profile.sp_saves_gathered_input) else h
    mlp_tensors = 2 if model.mlp == "gelu" else 4
    mlp_in_outputs = 1 if model.mlp == "gelu" else 2
    attn_copies, mlp_copies = gemm_input_copies(model, e, r)

    if model.norm == "rmsnorm" and profile.rms_norm == "composite":
        norms = 2 * 8 * T * h_s
    else:
        norms = 2 * r * T * h_s + 2 * 8 * rows
    gemm_inputs = (attn_copies + mlp_copies) * e * T * gemm_in
    qkv = e * T * h * (1 + 2 * g) / tp
    repeated_kv = e == 4 and g < 1 and profile.attention == "flash"
    qkv_saved = e * T * h * 3 / tp if repeated_kv else qkv
    out = profile.attention_output_copies * e * T * h / tp
    mlp = mlp_tensors * e * T * f / tp
    masks = 2 * T * h_s if profile.dropout else 0.0
    if profile.attention == "flash":
        attention_core = 4.0 * T * a / tp  # fp32 log-sum-exp per row and head
    else:
        attention_core = (2 * e + (1 if profile.dropout else 0)) * a * s * T / tp
    none = norms + gemm_inputs + qkv_saved + out + mlp + masks + attention_core

    block_input = r * T * h_s
    if profile.attention == "materialized":
        selective = none - attention_core
    else:
        reduced = 2 * e * T * h_s if tp > 1 else 0.0
        selective = block_input + qkv + e * T * h / tp + 4.0 * T * a / tp + reduced + mlp_in_outputs * e * T * f / tp
    return LayerActivations(none=none, selective=selective, full=block_input)


#: Logits per chunk of planc's loss (local ones under vocabulary parallelism); the runtime's
#: planc.runtime.loss.CHUNK_ELEMENTS is this constant (why 2**26: its comment there).
LOSS_CHUNK_ELEMENTS = 2**26


#: The loss kinds the cost model prices: a program's (``RuntimeProfile.loss``), and
#: ``chunked_recompute``, planc's chunked loss on the last stage of a GPipe or zero-bubble pipeline
#: (:func:`loss_kind`).
LossKind = Literal["chunked", "chunked_recompute", "whole", "megatron", "fused"]


#: Pipeline schedules whose last stage keeps several micro-batches' logits until their backwards:
#: GPipe runs every forward first; zero-bubble keeps each micro-batch's to its weight pass, and
#: with a recomputed loss to the step's end.
SCHEDULES_HOLDING_LOGITS = ("gpipe", "zero-bubble")


def micro_batches_holding_logits(schedule: str | None, pp: int, m: int, loss: str, style: StageStyle = "looped") -> int:
    """Micro-batches whose logits (and loss) the head's stage holds at its peak, of ``m`` per step.

    - GPipe runs every forward before any backward: all m.
    - Zero-bubble keeps every micro-batch's loss until the step ends
      (``PipelineScheduleSingle._internal_losses``) and its input pass retains the graph. With the
      loss recomputed in backward (``chunked_recompute``: vocabulary-sharded logits) the graph above
      the logits keeps their saved chunks as long: all m (Llama 3 70B, TP 8 x PP 4, simulated).
      With the gradient computed in the forward each micro-batch's logits go at its weight pass:
      the head stage's micro-batches between their forward and weight pass, min(p, m) under the
      looped schedule whatever v, and 1 under ZB-V, whose head stage runs its three passes back to
      back (both read off torch's order, tests/test_stages.py). ``planc verify --simulate`` of a
      4-layer Llama 3 8B on two stages held two micro-batches' logits at every point of the last
      stage's step (4 micro-batches, v = 1 and v = 2; the model had counted 4: +13.9%, +16.7%).
    - Every other schedule (and no pipeline): the one in flight.
    """
    if pp == 1 or schedule not in SCHEDULES_HOLDING_LOGITS:
        return 1
    if schedule == "gpipe" or loss == "chunked_recompute":
        return m
    return 1 if style == "v" else min(pp, m)


def loss_kind(profile_loss: str, pp: int, schedule: str | None = None, tp: int = 1) -> LossKind:
    """The loss a layout runs: planc's chunked loss computes each chunk's gradient in its forward
    (over the logits themselves when they are plain tensors, tp = 1), except for vocabulary-sharded
    logits (tp > 1) on the last stage of a pipeline whose schedule runs several of its forwards
    before their backwards (:data:`SCHEDULES_HOLDING_LOGITS`), where it recomputes the chunk in
    backward (``planc.strategies.pipeline.runtime``): the stage keeps each micro-batch's logits
    until its backward, so the chunks' gradients kept beside them would double what each
    micro-batch in flight holds. Under 1F1B and interleaved 1F1B the last stage runs each
    micro-batch's backward right after its forward: one in flight, and the gradient in the forward
    is faster."""
    if profile_loss == "chunked" and pp > 1 and tp > 1 and schedule in SCHEDULES_HOLDING_LOGITS:
        return "chunked_recompute"
    return profile_loss  # type: ignore[return-value]


def logits_bytes(
    model: ModelSpec,
    b: int,
    tp: int,
    compute_bytes: int,
    chunk_elements: int = LOSS_CHUNK_ELEMENTS,
    loss: LossKind = "chunked",
) -> float:
    """Peak bytes of the output logits, the loss and the logits' gradient for one micro-batch
    on the last stage (measured by bench/loss_memory.py; tests/runtime/test_loss.py).

    planc's loss (:mod:`planc.runtime.loss`) runs the float32 cross-entropy in K chunks of
    ``c = min(N, floor(C / V_t) V_t)`` logits, the last one ``c_l = N - (K - 1) c`` (N = s b V / t
    the local logits, V_t = V / t the local vocabulary, C = ``chunk_elements``):

    - ``chunked`` (its gradient in the forward), plain logits (t = 1): the forward writes the
      gradient over the logits chunk by chunk from the chunk's float32 copy and its log-softmax
      (2 x 4 c); backward scales it in place: ``e N + 8 c``.
    - ``chunked``, vocabulary-sharded DTensor logits (t > 1; each chunk differentiated by autograd
      under ``loss_parallel``): while chunk k is differentiated the logits (e N), the gradients
      kept from chunks 0..k-1 (e k c) and the chunk's float32 log-softmax output, its incoming
      and outgoing gradient (3 x 4 c_k) are alive. The peak is at the last chunk or the one
      before it (a short last chunk):

          e N + max(e (N - c_l) + 12 c_l,  e (K - 2) c + 12 c)

      which is ``2 e N + (12 - e) c`` when the chunks divide N evenly (measured on plain logits
      through the same autograd path, bench/loss_memory.py before the hand-worked gradient).
    - ``chunked_recompute`` (checkpointed chunks, vocabulary-sharded logits on a GPipe or
      zero-bubble last stage; the formula is for any t): the forward
      keeps only the logits. Backward recomputes one chunk at a time and hands each chunk's gradient
      (e c) to the split, which concatenates them once all have come; the peak is at the last
      chunk's log-softmax backward: the logits, the other chunks' gradients and 12 c,
      ``2 e N + (12 - e) c``.

    (Recomputed, e = 2: 4 N + 10 c; e = 4: 8 N + 8 c.) The unchunked float32 loss held 12 N at its peak (the
    log-softmax output, its incoming and its outgoing gradient over all logits), whatever e --
    Korthikanti et al. 2022 count 4 s b V for the float32 logits alone. When every token fits in
    one chunk, planc's loss is that unchunked loss: 12 N, below either bound; 16 N on sharded logits
    (t > 1): ``loss_parallel``'s backward (torch 2.13, ``tensor/parallel/loss.py``,
    ``_nll_loss_and_log_softmax_backward``) holds the saved log-softmax output x, the zeroed
    gradient, ``exp(x)`` and their sum (simulated, fp32 and bf16, where 12 N was priced).

    Other programs (``RuntimeProfile.loss``): ``whole`` is that unchunked loss, 12 N;
    ``megatron`` (Megatron's vocab-parallel cross-entropy, which computes the softmax in place in
    an fp32 copy of the logits and keeps it for backward) the head's output and that copy and its
    softmax, (e + 8) N; ``fused`` (a Triton cross-entropy that keeps fp32 in registers) the logits
    and their gradient, 2 e N.
    """
    n, one_chunk = _local_logits(model, b, tp, chunk_elements)
    if loss == "whole":
        return 12 * n
    if loss == "fused":
        return 2 * compute_bytes * n
    if loss == "megatron":
        return (compute_bytes + 8) * n
    if one_chunk:  # run as the whole loss, without checkpointing (planc.runtime.loss)
        return (16 if tp > 1 else 12) * n
    local_vocab = max(1, model.padded_vocab // tp)
    c = min(n, max(1, chunk_elements // local_vocab) * local_vocab)
    e = compute_bytes
    if loss == "chunked_recompute":
        return 2 * e * n + (12 - e) * c
    if tp == 1:
        return e * n + 8 * c
    chunks = math.ceil(n / c)
    last = n - (chunks - 1) * c
    return e * n + max(e * (n - last) + 12 * last, e * (chunks - 2) * c + 12 * c)


def local_logits(model: ModelSpec, b: int, tp: int) -> float:
    """N: the logits of one micro-batch of ``b`` sequences on a tensor-parallel rank (s b V / t)."""
    return model.seq_len * b * model.padded_vocab / tp


def _local_logits(model: ModelSpec, b: int, tp: int, chunk_elements: int) -> tuple[float, bool]:
    """(N, the logits of one micro-batch on a tensor-parallel rank; whether they fit one loss chunk)."""
    local_vocab = max(1, model.padded_vocab // tp)
    return local_logits(model, b, tp), max(1, chunk_elements // local_vocab) >= model.seq_len * b


def loss_checkpointed(model: ModelSpec, b: int, tp: int, loss: str = "chunked_recompute") -> bool:
    """Whether planc's loss runs in checkpointed chunks for this micro-batch (``planc/runtime/loss.py``):
    on the last stage of a GPipe or zero-bubble pipeline, with more local logits than one chunk
    holds. Its backward then reruns each chunk's forward."""
    return loss == "chunked_recompute" and not _local_logits(model, b, tp, LOSS_CHUNK_ELEMENTS)[1]


def loss_in_forward(model: ModelSpec, b: int, tp: int, loss: str = "chunked") -> bool:
    """Whether planc's loss computes its chunks' gradients in the forward (``loss = "chunked"``
    with more local logits than one chunk holds): backward only scales them."""
    return loss == "chunked" and not _local_logits(model, b, tp, LOSS_CHUNK_ELEMENTS)[1]


def loss_saved_bytes(model: ModelSpec, b: int, tp: int, compute_bytes: int, loss: str = "chunked_recompute") -> float:
    """Bytes one micro-batch's logits and loss keep from its forward until its backward on the
    last pipeline stage (what a schedule that runs several forwards before their backwards holds
    per micro-batch; :func:`logits_bytes` is the peak of the one whose loss runs).

    torch's ``PipelineStage`` keeps each micro-batch's output -- the logits, e N (N as in
    :func:`logits_bytes`) -- until that micro-batch's backward. planc's chunked loss keeps only
    that storage: on plain logits the gradient is written over them (``chunked``, t = 1), and on
    vocabulary-sharded ones each chunk is recomputed (``chunked_recompute``); the chunks' gradients
    kept beside sharded logits (``chunked``, t > 1) would hold 2 e N; the unchunked float32 loss
    (one chunk, or ``whole``) also keeps log-softmax's float32 output, 4 N; Megatron's its float32
    softmax, 4 N.
    Simulated (tests/verify/test_simulate_pipeline.py, GPipe, one chunk): 8.1 N per micro-batch
    in fp32, 6.0 N in bf16.
    """
    n, _ = _local_logits(model, b, tp, LOSS_CHUNK_ELEMENTS)
    if loss_checkpointed(model, b, tp, loss) or loss == "fused":
        return compute_bytes * n
    if loss_in_forward(model, b, tp, loss):
        return (1 if tp == 1 else 2) * compute_bytes * n
    return (compute_bytes + 4) * n


def split_backward_output_grads(model: ModelSpec, tokens: int, tp: int, sequence_parallel: bool, e: int) -> float:
    """Bytes one block keeps from zero-bubble's input-gradient pass to its weight-gradient pass,
    beyond its activations, for one micro-batch of ``tokens`` tokens.

    torch's split backward (``torch.distributed.pipelining._backward.stage_backward_input``)
    keeps, for each parameter group, the gradient of the group's output -- each linear's output,
    each norm's -- so that the weight pass can start from there. Per block: the column-parallel
    outputs (q, k, v and the MLP's input projections) sharded over ``tp``; the row-parallel ones
    (attention-out, MLP-out) whole, as the partial sums they are before their reduction; the two
    norms' outputs, over ``tp`` under sequence parallelism, whole otherwise; in compute precision.
    Measured on 4 of planc's Llama blocks (``python bench/split_backward_recompute.py``, "kept
    between the halves"): 26.5 MiB against 26.0 by this formula."""
    h, f, kv = model.hidden, model.ffn, model.kv_dim
    q = model.heads * model.head_dim
    mlp_in = 2 if model.mlp == "swiglu" else 1
    column = (q + 2 * kv + mlp_in * f) / tp
    row = 2 * h
    norms = 2 * h / (tp if sequence_parallel else 1)
    return e * tokens * (column + row + norms)


def head_saved_bytes(model: ModelSpec, tokens: int, tp: int, sequence_parallel: bool, residual: int, e: int) -> float:
    """Bytes the final norm and the output head save for backward per micro-batch, beside the
    loss's (:func:`loss_saved_bytes`): the norm's input, the residual stream (``residual`` bytes,
    over ``tp`` under sequence parallelism), and the head GEMM's input, the norm's output in
    compute precision (the whole sequence: sequence parallelism gathers it for the column-parallel
    head; under autocast a bf16 cast of the fp32 output). ``planc verify`` lists them apart from
    the blocks ("embedding, final norm, head": 261 KiB beside 1 MiB per block on the CPU matrix's
    last pipeline stage); ``planc verify --simulate`` of a 4-layer Llama 3 8B's last 1F1B stage
    read 0.31 GiB above the model without them and the norm's fp32 output under autocast
    (:mod:`planc.strategies.bf16.cost_pass`; -1.3%), GPipe's, with four micro-batches' waiting,
    0.9 GiB (-2.2%)."""
    shards = tp if sequence_parallel else 1
    return tokens * model.hidden * (residual / shards + e)


# -- fixed overheads ---------------------------------------------------------------------------

#: CUDA context, cuBLAS/cuDNN workspaces and NCCL's internal buffers, per GPU: a fixed term.
#: The CUDA context alone takes ~0.3-0.5 GiB outside PyTorch's allocator; cuBLAS keeps a
#: workspace per stream and NCCL a few MiB per channel and peer. 1 GiB is a round estimate.
DEVICE_RUNTIME_OVERHEAD = 1 * GiB

#: PyTorch's caching allocator rounds blocks up and fragments under changing shapes; we reserve
#: this fraction of everything else. A stated allowance, not a measured constant.
ALLOCATOR_MARGIN = 0.05

#: DDP's gradient bucket size (planc's ddp/zero1 option ``bucket``, default 25 MB; torch's
#: ``bucket_cap_mb=25``).
DDP_BUCKET_BYTES = 25e6


def fsdp_gather_bytes(
    block: int, root: int, head: int, zero: int, compute_bytes: int, grad_reduce_bytes: int
) -> tuple[float, float]:
    """(held from the head's backward to the embedding's, held while a block runs backward) bytes of
    FSDP2's buffers, for ``block`` parameters per block unit, ``root`` in the model part's root unit
    (embedding, final norm and head together: the parameters outside the blocks) and ``head`` of them
    in the final norm and head.

    From the head's backward to the end of backward: under ZeRO-3 the root unit is gathered for the
    head's backward and stays gathered until the embedding's gradient at the end (e x root; issue
    13's simulation found it twice the one unit, the larger of embedding and head, that was
    modelled), and the head's unsharded gradient waits for the root's reduce-scatter at the end
    (e x head). Neither exists in the forward or the loss (ZeRO-3 reshards the root after its
    forward; simulated, fp32, vocabulary 8192: counted at the loss, ZeRO-2's peak read +13%).

    While a block runs backward: the running block's gathered parameters and the prefetched next
    one's (ZeRO-3, 2 x e x block), and the block's unsharded gradients in compute precision; at its
    end ``FSDPParamGroup.post_backward`` reshards the block, then ``foreach_reduce`` copies the
    gradients into a reduce-scatter input of its own in the reduce dtype (torch 2.13,
    ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``): g x block more in mixed
    precision; in fp32 the copy takes the resharded parameters' place (g = e), and the first block
    to run backward, where the activations are at their most, holds no earlier block's input (a
    later one holds the previous unit's until its own, ``comm_ctx.reduce_scatter_states``: the
    embedding's backward, :func:`planc.strategies.fsdp.cost_pass.reduced_embedding_gradient`).
    The root's own reduce-scatter comes after the last block, when the activations are gone
    (:func:`planc.strategies.fsdp.cost_pass._root_gathers`).
    """
    g = grad_reduce_bytes if grad_reduce_bytes != compute_bytes else 0
    held = (root * compute_bytes if zero == 3 else 0.0) + head * compute_bytes
    per_block = (2 * block * compute_bytes if zero == 3 else 0.0) + block * (compute_bytes + g)
    return held, per_block
