"""Host overhead of eager PyTorch: ops per block, per micro-batch and per step, times a measured cost per op.

Eager PyTorch pays a host cost for every aten op (dispatch, autograd recording, launch) whatever
the tensor's size. It matters when kernels are small: on a CPU it adds to the compute, on a GPU
it bounds it from below (the device idles when the host cannot queue kernels fast enough). The
cost per op is what ``planc calibrate`` measured (``MeasuredRates.seconds_per_op``). Without a
profile a GPU takes :data:`GPU_SECONDS_PER_OP`, what planc calibrate measured on the hosts of the
GPUs planc ran on: large kernels hide it (it changes no large run's prediction), and a small
model's step is what it sets (a 4-layer, 256-wide model on one H100: 30 ms measured, 1.4 ms
predicted with this term at 0). A CPU without a profile keeps 0: its uncalibrated prediction is
the data sheet's, and says so.

The op counts are planc's own program, counted with a ``TorchDispatchMode`` on one process by
``tools/count_eager_ops.py`` (torch 2.13; ``tests/cost/test_dispatch_counts.py`` recounts the
block table): a block's forward and backward by (norm, mlp, position); the optimizer's ops per
parameter tensor (none: planc's AdamW is fused on CPU and CUDA); the embedding, head and loss per
micro-batch; and what a step runs once (the optimizer, zeroing, clipping, the schedule, logging).
Strategy wrappers (DDP hooks, FSDP2 hooks, DTensor dispatch, the pipeline schedule) add Python
overhead per op that these counts do not hold.
"""

from __future__ import annotations

from planc.spec.model import ModelSpec

#: (forward, backward) aten ops of one block by (norm, mlp, position), GQA (kv_heads < heads)
#: included (its repeat of K and V: 8 forward ops); recount with tools/count_eager_ops.py.
BLOCK_OPS = {
    ("layernorm", "gelu", "learned"): (47, 101),
    ("layernorm", "gelu", "rope"): (81, 128),
    ("layernorm", "swiglu", "learned"): (52, 93),
    ("layernorm", "swiglu", "rope"): (86, 120),
    ("rmsnorm", "gelu", "learned"): (59, 131),
    ("rmsnorm", "gelu", "rope"): (93, 158),
    ("rmsnorm", "swiglu", "learned"): (64, 125),
    ("rmsnorm", "swiglu", "rope"): (98, 152),
}
#: Tensor parallelism's ops that reach DTensor's dispatch (an argument is a DTensor), by (norm,
#: mlp, position): (forward, backward) of one block and one micro-batch's embedding, final norm,
#: head and parallel loss, forward and backward -- the same with and without sequence parallelism.
#: Only these pay DTensor's per-op cost: with ``use_local_output`` the attention core, RoPE and the
#: MLP's activation run on local tensors, so a Llama block runs 1.36x the GPT block's DTensor ops
#: (144 / 106), not the 1.69x of all its ops (250 / 148). Counted on planc's program under TP 2
#: (``python tools/count_eager_ops.py --dtensor``); ``_AUTOCAST``: the same under bf16 autocast
#: over fp32 parameters (tensor parallelism without FSDP), whose casts of the DTensor weights are
#: DTensor ops too.
DTENSOR_OPS = {
    ("layernorm", "gelu", "learned"): (26, 80, 35),
    ("layernorm", "gelu", "rope"): (26, 80, 32),
    ("layernorm", "swiglu", "learned"): (30, 70, 34),
    ("layernorm", "swiglu", "rope"): (30, 70, 31),
    ("rmsnorm", "gelu", "learned"): (38, 110, 56),
    ("rmsnorm", "gelu", "rope"): (38, 110, 53),
    ("rmsnorm", "swiglu", "learned"): (42, 102, 56),
    ("rmsnorm", "swiglu", "rope"): (42, 102, 53),
}
DTENSOR_OPS_AUTOCAST = {
    ("layernorm", "gelu", "learned"): (42, 96, 41),
    ("layernorm", "gelu", "rope"): (42, 96, 38),
    ("layernorm", "swiglu", "learned"): (42, 82, 40),
    ("layernorm", "swiglu", "rope"): (42, 82, 37),
    ("rmsnorm", "gelu", "learned"): (54, 126, 62),
    ("rmsnorm", "gelu", "rope"): (54, 126, 59),
    ("rmsnorm", "swiglu", "learned"): (54, 114, 62),
    ("rmsnorm", "swiglu", "rope"): (54, 114, 59),
}
#: Optimizer step and gradient clipping per parameter tensor: none. planc's optimizer is torch's
#: fused kernel on CPU and CUDA (one call per parameter group) and clipping's norm and rescale are
#: foreach ops (one per group). Until 2026-11-29 the CPU ran AdamW's single-tensor loop: 9.4 ops
#: per tensor, counted in fp32 (168 / 16 = 10.5 as counted then, under bf16 autocast, which
#: counted the blocks' casts here as well).
OPS_PER_PARAMETER_TENSOR = 0.0
#: Embedding, final norm, head and loss of one micro-batch, forward and backward, in fp32 (under
#: autocast :meth:`~planc.cost.compute.Device.seconds_per_model_op` scales them; 75 as counted
#: under bf16 until 2026-11-29, which counted the casts twice).
MICRO_BATCH_OPS = 51
#: Once per step: the fused optimizer and the foreach clipping, zeroing gradients, clipping's
#: total norm, the learning-rate schedule, the step's summary (39.7 counted; 42 before the norm
#: worked on local shards and the summary became one gather, 86 before the fused optimizer).
STEP_OPS = 40
#: Host seconds per eager op on a GPU machine without a profile: `planc calibrate` measured
#: 11.8 and 11.9 us on the H100 machine's host and 14.7 us on the H200's
#: (docs/gpu-runs/2026-11-27-h100/*.json, docs/gpu-runs/2026-11-27-h200/h200-plan.json); the
#: lower figure, as a host at least that fast is what a GPU node has. Those calibrations timed a
#: chain of elementwise multiplies, which on this project's CPU read half of what planc's own ops
#: cost (planc.calibrate.dispatch, since 2026-11-29: there the kernels run on the host too). On
#: the H100 host planc's ops cost about 1.1x the chain: a 4-layer, 256-wide model's step measured
#: 29.9 ms against 26.6 ms predicted at 12 us per op (docs/gpu.md).
GPU_SECONDS_PER_OP = 12e-6


def block_ops(model: ModelSpec) -> tuple[int, int]:
    """(forward, backward) eager ops of one block of ``model``."""
    return BLOCK_OPS[(model.norm, model.mlp, model.position)]


def dtensor_ops(model: ModelSpec, autocast: bool = False) -> tuple[int, int, int]:
    """(forward, backward) DTensor ops of one block of ``model`` under tensor parallelism, and those
    of one micro-batch outside the blocks (:data:`DTENSOR_OPS`; under autocast the casts too)."""
    table = DTENSOR_OPS_AUTOCAST if autocast else DTENSOR_OPS
    return table[(model.norm, model.mlp, model.position)]


def linears_per_block(mlp: str) -> int:
    """Linear layers of one block: the attention's four and the MLP's two (three under SwiGLU)."""
    return 4 + (3 if mlp == "swiglu" else 2)


def parameter_groups_per_block(mlp: str) -> int:
    """What torch's split backward walks one root per: each linear (its weight and bias) and the two norms."""
    return linears_per_block(mlp) + 2


def tensors_per_block(model: ModelSpec) -> int:
    """Parameter tensors of one block: linears (with their biases) and norms (LayerNorm has a bias)."""
    linears = linears_per_block(model.mlp)
    biases = linears if model.bias else (3 if model.qkv_bias else 0)
    norms = 2 * (2 if model.norm == "layernorm" else 1)
    return linears + biases + norms


def combine(device_seconds: float, host_seconds: float, cpu: bool) -> float:
    """A CPU runs host and kernels one after the other; a GPU overlaps them, the slower one sets the pace."""
    return device_seconds + host_seconds if cpu else max(device_seconds, host_seconds)


def step_host_ops(model: ModelSpec, layers: int) -> float:
    """Ops a step runs outside the blocks' forward and backward for ``layers`` blocks on a rank.

    planc's optimizer is fused AdamW (``fused=True``, on CPU and CUDA alike) and clipping runs
    torch's foreach norm: each is a handful of ops over all tensors at once, so only the per-step
    ops remain."""
    return STEP_OPS + OPS_PER_PARAMETER_TENSOR * tensors_per_block(model) * layers
