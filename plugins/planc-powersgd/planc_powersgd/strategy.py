"""``powersgd``: PowerSGD compression of DDP's gradient all-reduce (a planc strategy plugin).

Plan time (no torch): typed options, when it applies, and a pure cost pass that scales the
data-parallel gradient traffic by PowerSGD's compression ratio and adds its error-feedback
buffer. Run time: registers PyTorch's ``powerSGD_hook`` on every DistributedDataParallel model
part, once ``ddp`` (or ``zero1``) has wrapped them.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import BaseModel, ConfigDict, Field

from planc.cost.comm import all_reduce_seconds
from planc.cost.data_parallel import CONTENTION, grad_all_reduce
from planc.cost.estimate import CommCost, Term
from planc.cost.memory import DDP_BUCKET_BYTES
from planc.spec.fields import Flag
from planc.units import format_bytes
from planc_powersgd.compression import compressed_matrices, traffic_ratio

NAME = "powersgd"
API_VERSION = 1
DESCRIPTION = "PowerSGD low-rank compression of DDP's gradient all-reduce (Vogels et al. 2019)"
#: DDP must exist before a communication hook can be registered on it.
AFTER: tuple[str, ...] = ("ddp", "zero1")


class Options(BaseModel):
    """Options of ``use powersgd { ... }``."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    rank: int = Field(default=4, ge=1)
    """Rank r of the low-rank approximation: an n x m gradient travels as (n + m) r numbers."""
    start_iter: int = Field(default=10, ge=2)
    """Optimizer steps of plain all-reduce before compression starts (PyTorch needs >= 2)."""
    min_compression_rate: float = Field(default=2.0, gt=0)
    """Compress a matrix only when this saves at least this factor; others travel uncompressed."""
    error_feedback: Flag = True
    """Carry the compression error into the next step's gradient (Vogels et al. 2019, Sec. 3)."""


def check(plan, layout, options: Options) -> str | None:
    if layout.dp < 2:
        return "compresses data-parallel gradients, so it needs dp > 1"
    if layout.zero >= 2:
        return (
            f"PowerSGD is a DistributedDataParallel communication hook; zero = {layout.zero} uses FSDP, which has "
            "none. Use zero = 0 or 1, or drop the use block"
        )
    ddp_bf16_weights = all(use.options.get("bf16_weights", True) is not False for use in plan.uses if use.name == "ddp")
    if layout.zero == 0 and plan.train.precision == "bf16" and ddp_bf16_weights:
        return (
            "PowerSGD is a DistributedDataParallel communication hook; with bf16, ddp computes with bf16 weights "
            "through FSDP2's replicate, which has none. Add `use ddp { bf16_weights = false }` (DDP under "
            "autocast), or use zero = 1, or drop the use block"
        )
    return None


def steady_after(plan, options: Options) -> int:
    """The hook all-reduces uncompressed for the first ``start_iter`` optimizer steps (torch's
    ``PowerSGDState.iter`` counts them from 0 and compression starts when it reaches
    ``start_powerSGD_iter``); the cost pass prices the compressing steps after them, so
    ``planc verify`` runs these unmeasured first."""
    return options.start_iter


#: DistributedDataParallel's gradient bucket (``bucket_cap_mb``'s default, and planc's ddp's).
BUCKET_BYTES = 25 * 2**20


def cost(ctx, estimate, options: Options):
    """Scale the "dp" gradient traffic by PowerSGD's element ratio; add the all-reduce rounds the
    hook chains after backward; add the error-feedback buffer.

    Under ``zero = 0`` the "dp" traffic is exactly the gradient all-reduce, all of it scaled. Under
    ZeRO-1 it is DistributedDataParallel's gradient all-reduce, which the hook replaces as under
    ``zero = 0`` (``zero1`` wraps the model in DDP; ``ZeroRedundancyOptimizer`` is only the
    optimizer), plus the optimizer's parameter broadcast after the step, which the hook never
    sees: only the gradient part (:func:`planc.cost.data_parallel.grad_all_reduce`, with zero1's
    bucket, as its own pass prices it) is scaled. The traffic after ``start_iter`` is what a long
    run pays, so that is what is charged.

    Per bucket, torch's ``powerSGD_hook`` runs three all-reduces, each waiting for the one before
    (futures chained with ``then``): the uncompressed tensors, then P, then Q (computed from P).
    Earlier buckets' rounds overlap backward; the last bucket's come after it, so two rounds more
    than a plain all-reduce are on the critical path: 2 x the all-reduce of that bucket's P (and of
    its Q, about as large), at the group's latency and bandwidth. On a CPU the hook's own ops add to
    the step too (:func:`hook_host_seconds`, about 25 per compressed matrix): measured on 2 gloo
    processes (``python bench/powersgd_steps.py``: the CPU matrix's ``powersgd-compressing`` at 2, 4
    and 8 layers, 15 to 51 compressed matrices), compression added 3.5, 5.8 and 7.5 ms per step on
    2026-11-29 (3.5-5.0 ms, flat, in an earlier session's run), about 0.11 ms per matrix and 1.9 ms
    beside it, of which the two rounds are ~0.5 ms; the rest (the chained futures' callbacks handed
    between threads) is not modelled. The low-rank matmuls (about 4 n m r FLOPs per matrix) are
    ignored: a few per cent of r / h of the backward's. Error feedback keeps
    one fp32 residual per gradient element (Vogels et al. 2019, Alg. 2).
    """
    layout = ctx.layout
    dp = estimate.comm_of("dp")
    if dp is None or layout.dp < 2:
        return estimate
    ratio = traffic_ratio(ctx.plan.model, layout.tp, options.rank, options.min_compression_rate)
    if layout.zero in (0, 1):
        # The gradient all-reduce is the DP traffic that overlaps backward (ZeRO-1's broadcast
        # comes after the step, exposed): compressing it shrinks the compute it slows as much.
        other = tuple(Term(t.name, t.value * ratio) if t.name == CONTENTION else t for t in estimate.other)
        estimate = estimate.updated(comm=compressed(ctx, dp, ratio, options.rank), other=other).with_note(
            f"PowerSGD rank {options.rank}: data-parallel gradient traffic x {ratio:.3f} from step "
            f"{options.start_iter + 1} (the first {options.start_iter} all-reduce uncompressed)"
        )
    chained = chained_rounds(ctx, ratio)
    estimate = estimate.with_time("PowerSGD: the last bucket's P and Q all-reduces, chained", chained)
    host = hook_host_seconds(ctx, options)
    if host > 0:
        estimate = estimate.with_time(HOOK_HOST, host)
    if options.error_feedback:
        estimate = estimate.map_stages(
            lambda s: s.updated(transient=(Term("PowerSGD error feedback", s.grads), *_decompression(ctx, s)))
        )
    return estimate


def _decompression(ctx, s) -> tuple[Term, ...]:
    """What error feedback adds while the hook decompresses a bucket: the copy of the bucket it took
    before compressing (``input_tensor_cp``) and the new residual (``input_tensor_cp -
    input_tensor``), beside the old one until it replaces it -- two buckets of gradients. The last
    bucket's hook runs after the backward, its activations gone (``planc verify``, the CPU matrix's
    ``ddp-powersgd``: 13.4 MB measured there, -9.7 % before these were priced); earlier buckets'
    run beside the backward's activations."""
    name = "PowerSGD error feedback: a bucket's copy and its new residual, as the hook decompresses"
    bucket = min(s.grads, BUCKET_BYTES)
    if s.grads > BUCKET_BYTES:
        return (Term(name, 2 * bucket, "backward"),)
    after = 2 * bucket - ctx.chunk_activations(ctx.stage(s.rank))  # the backward's last activations are gone
    return (Term(name + " (after the backward)", after, "embedding"),) if after > 0 else ()


#: Top-level aten ops the hook runs per compressed matrix (views into its P and Q buffers, the two
#: low-rank products, the orthogonalisation's norm and division, error feedback's copies and the
#: decompression), counted with torch.profiler on torch 2.13 over 8 and 16 compressed 32 x 32
#: matrices: 251 and 491 ops per step, 30 per matrix, of which 5 are the linear's own.
HOOK_OPS_PER_MATRIX = 25
#: The named time term of the hook's host work.
HOOK_HOST = "PowerSGD: the hook's own ops, per compressed matrix"


def hook_host_seconds(ctx, options: Options) -> float:
    """The hook's host work on a CPU, where it adds to the step: :data:`HOOK_OPS_PER_MATRIX` per
    compressed matrix at the profile's cost per op (0 without a profile). On a GPU the host runs
    ahead of the kernels, as the cost model treats every host op there: not added.

    Measured on 2 gloo processes (``python bench/powersgd_steps.py``, 2026-11-29): compression added
    3.5, 5.8 and 7.5 ms per step at 15, 27 and 51 compressed matrices, 0.11 ms per matrix and about
    1.9 ms beside; this term prices the per-matrix part (25 ops at the 5 us per op calibrate measured
    that hour, 0.125 ms), the two chained rounds about 0.5 ms of the rest; the remaining ~1.3 ms
    (the chained futures' callbacks handed between gloo's threads) is not modelled."""
    device = ctx.device
    if device.sms is not None:
        return 0.0
    model = ctx.plan.model
    matrices = compressed_matrices(model, ctx.layout.tp, options.rank, options.min_compression_rate)
    return matrices * HOOK_OPS_PER_MATRIX * device.seconds_per_op


def compressed(ctx, dp: CommCost, ratio: float, rank: int) -> CommCost:
    """The "dp" entry with its gradient all-reduce scaled by ``ratio`` and said so in its detail.

    Under ``zero = 0`` the whole entry is that all-reduce. Under ZeRO-1 the entry is the
    all-reduce and then the parameter broadcast (``zero1``'s pass: "all-reduce of gradients +
    broadcast of ..."): the all-reduce's volume, seconds and exposed seconds, as
    ``grad_all_reduce`` gives them for zero1's bucket, shrink; the broadcast stays."""
    layout = ctx.layout
    nbytes, seconds, exposed = grad_all_reduce(ctx, _bucket(ctx.plan, "zero1" if layout.zero else "ddp"))
    sent = (
        f"PowerSGD rank {rank}: all-reduce of {format_bytes(ratio * nbytes)} of low-rank factors "
        f"for {format_bytes(nbytes)} fp32 gradients (x {ratio:.3f})"
    )
    if layout.zero == 0:
        return replace(dp.scaled(ratio), detail=sent)
    saved = 1 - ratio
    volume = 2 * (layout.dp - 1) / layout.dp * nbytes  # the all-reduce's share of the entry's volume
    rest = dp.detail.partition(" + ")[2]
    return replace(
        dp,
        volume=dp.volume - saved * volume,
        total=dp.total - saved * seconds,
        exposed=dp.exposed - saved * exposed,
        detail=f"{sent} + {rest}" if rest else sent,
    )


def _bucket(plan, strategy: str) -> float:
    """The gradient bucket of ``use ddp`` / ``use zero1`` (their ``bucket`` option, in bytes)."""
    for use in plan.uses:
        if use.name == strategy and use.options.get("bucket") is not None:
            return float(use.options["bucket"])
    return DDP_BUCKET_BYTES


def chained_rounds(ctx, ratio: float) -> float:
    """Seconds of the two all-reduces (P, then Q) of the last gradient bucket that the hook runs
    after the plain one: each of about half the bucket's compressed traffic."""
    gradient_bytes = ctx.grad_reduce_bytes * max(stage.params for stage in ctx.stages)
    last_bucket = min(gradient_bytes, BUCKET_BYTES)
    return 2 * all_reduce_seconds(last_bucket * ratio / 2, ctx.links["dp"])


def apply(job, options: Options) -> None:
    """Register ``powerSGD_hook`` on every DDP model part (after DDP has wrapped them)."""

    def register(job) -> None:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
        from torch.nn.parallel import DistributedDataParallel

        for part in job.model_parts:
            if not isinstance(part, DistributedDataParallel):
                raise RuntimeError("powersgd needs DistributedDataParallel model parts: apply ddp or zero1 first")
            state = powerSGD_hook.PowerSGDState(
                process_group=job.group("dp"),
                matrix_approximation_rank=options.rank,
                start_powerSGD_iter=options.start_iter,
                min_compression_rate=options.min_compression_rate,
                use_error_feedback=options.error_feedback,
                warm_start=options.error_feedback,
                random_seed=job.plan.train.seed,
            )
            part.register_comm_hook(state, powerSGD_hook.powerSGD_hook)

    job.after_init(register)
