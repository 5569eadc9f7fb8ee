"""The plan-time cost pass of ``bf16`` (pure; no torch)."""

from __future__ import annotations

from planc.cost.block_backward import through_backward
from planc.cost.context import CostContext
from planc.cost.estimate import Estimate, StageMemory, Term
from planc.cost.params import linear_params_per_shard, vocab_matrix_per_shard

#: Bytes per parameter and micro-batch that autocast moves outside the GEMMs: the fp32 -> bf16
#: weight cast in forward (read 4, write 2) and, in backward, the cast of the bf16 weight
#: gradient back to fp32 (``ToCopyBackward``: read 2, write 4). On an H100 the casts ran as
#: separate copy kernels, ``bfloat16_copy_kernel_cuda`` and ``direct_copy_kernel_cuda``
#: (docs/gpu.md), not fused with the accumulation below.
AUTOCAST_CAST_BYTES_PER_PARAM = 6 + 6
#: Adding that fp32 gradient into an existing fp32 ``.grad`` (read 4, read 4, write 4): every
#: micro-batch but the first, whose gradient becomes ``.grad`` -- and the first too where the
#: gradients live in DDP's buckets, which the step zeroes in place (ZeRO-1, DDP under autocast).
GRADIENT_ACCUMULATE_BYTES_PER_PARAM = 12


def cost(ctx: CostContext, est: Estimate, options: object = None) -> Estimate:
    """bf16 mixed precision. With fp32 parameters under ``torch.autocast`` (DDP, ZeRO-1) every
    linear's weight is cast to bf16 for its GEMM and the copy is saved for backward
    (:func:`autocast_copy_terms`), and the casts and fp32 gradient accumulation cost
    :data:`AUTOCAST_CAST_BYTES_PER_PARAM` and :data:`GRADIENT_ACCUMULATE_BYTES_PER_PARAM` of memory
    traffic per micro-batch; recomputation casts the blocks' weights again (forward half: 6
    bytes). FSDP's bf16 parameters (ZeRO-2/3, DDP through ``replicate``) need none of it. The bf16
    compute rate and 2-byte activations are already in the context's dtypes."""
    if not block_copy_bytes(ctx):
        return est
    m = ctx.micro_batches
    accumulations = m if ctx.layout.dp > 1 else m - 1
    recast = ctx.layout.recompute != "none"

    def traffic(rank: int) -> float:
        st = ctx.stage(rank)
        blocks = st.layers * linear_params_per_shard(ctx.model, ctx.layout.tp)
        cast = blocks + (vocab_matrix_per_shard(ctx.model, ctx.layout.tp) if st.head else 0)
        forward_half = AUTOCAST_CAST_BYTES_PER_PARAM / 2
        return m * (AUTOCAST_CAST_BYTES_PER_PARAM * cast + recast * forward_half * blocks) + (
            accumulations * GRADIENT_ACCUMULATE_BYTES_PER_PARAM * st.params
        )

    casts = max(traffic(st.rank) for st in ctx.stages) / ctx.device.memory_rate
    return est.updated(
        stage_fn=lambda s: s.updated(transient=autocast_copy_terms(ctx, s)),
        compute=est.compute + casts,
    )


def block_copy_bytes(ctx: CostContext) -> float:
    """Bytes of autocast's bf16 copies of one block's linears on one device: 0 unless the
    parameters are fp32 under bf16 autocast (DDP under autocast, ZeRO-1, no data parallelism)."""
    if ctx.plan.train.precision != "bf16" or ctx.state_bytes.working < 4:
        return 0.0
    return 2.0 * linear_params_per_shard(ctx.model, ctx.layout.tp)


def autocast_copy_terms(ctx: CostContext, s: StageMemory) -> tuple[Term, ...]:
    """The bf16 weight copies pipeline rank ``s.rank`` holds, by phase of the step.

    Autocast casts a weight once per forward and caches the copy until the outermost autocast
    region exits, at the end of each micro-batch's forward (of each chunk's, under a pipeline);
    each linear also saves its copy for backward, so a copy lives as long as the micro-batch's
    graph needs it:

    - without recomputation, every block-micro-batch in flight (``s.act_layers``, what the pipeline
      schedule keeps) holds its block's copies, as it holds its activations;
    - under full or selective recomputation the checkpointed blocks save none (the cast is not among
      the ops selective recomputation saves), but the cache holds every copy of the chunk's blocks
      until its forward ends -- on the last stage while the head's GEMM writes the logits beside its
      own copy ("forward" phase); one block's copies exist again from its rerun's end through its
      backward ("recompute" and "backward" phases, :mod:`planc.cost.block_backward`, which also
      holds the block's incoming gradient and its cast to bf16);
    - the final norm's output stays in fp32 while the head's GEMM runs on its bf16 cast ("forward");
    - the output head keeps its copy until its backward, once per micro-batch whose loss waits
      (every micro-batch on the last stage of GPipe and zero-bubble) ("loss" phase); its GEMM's
      backward holds the logits' gradient, the copy and the weight's bf16 gradient at once ("head
      backward" phase);
    - the embedding's lookup is not autocast: no copy.

    Measured on one H100 (docs/gpu.md, third session): counting all 2 bytes per parameter once
    over-predicted the peak of full and selective recomputation by 2.3-2.4 GiB (+6-7%), the copies
    of the four checkpointed blocks and of the embedding; ``planc verify --simulate`` of pipelines
    under-predicted GPipe's by 17-28% (tests/verify/test_simulate_autocast.py). With the logits'
    gradient written over them the peak of full recomputation moved to the head's forward, where
    the simulated step and the H100 agree (34.0 and 34.1 GiB) with these phases.
    """
    block = block_copy_bytes(ctx)
    if not block:
        return ()
    lay = ctx.layout
    st = ctx.stage(s.rank)
    recomputed = lay.recompute != "none"
    terms: tuple[Term, ...]
    if recomputed:
        name = "autocast's bf16 copies of the recomputed block's weights"
        terms = (Term(name, block, through_backward(lay.recompute)),)
    else:
        held = s.act_layers
        terms = (Term(f"autocast's bf16 weight copies ({held:g} block-micro-batches)", block * held),)
    cached = block * st.layers / lay.virtual_stages if recomputed else 0.0
    if not st.head:
        if cached:
            name = "autocast's cache of the chunk's bf16 block weights, to the forward's end"
            terms += (Term(name, cached, "forward"),)
        return terms
    waiting = ctx.micro_batches_holding_logits
    # The head's weight is cast for its GEMM even when tied to the embedding, whose own lookup
    # autocast leaves in fp32.
    head = 2.0 * vocab_matrix_per_shard(ctx.model, lay.tp)
    name = "autocast's bf16 copy of the output head's weight"
    terms += (Term(name + (f" ({waiting} micro-batches)" if waiting > 1 else ""), head * waiting, "loss"),)
    # The forward's last GEMM writes the logits (the base estimate's "forward" term) beside the
    # head's copy, while the cache still holds every block's under recomputation (the waiting
    # micro-batches' head copies stay too).
    name = "autocast's cached bf16 weight copies, at the head's forward"
    terms += (Term(name, cached + head * waiting, "forward"),)
    # The final norm's output stays in fp32 beside the bf16 cast the head's GEMM reads (and saves).
    norm_output = ctx.residual_bytes * ctx.tokens_per_microbatch * ctx.model.hidden
    terms += (Term("final norm's fp32 output, as the head's GEMM runs", norm_output, "forward"),)
    # The head's GEMM backward: the logits' gradient (the base estimate's term), the weight's copy
    # it multiplies by and the weight's bf16 gradient it writes, all alive at once; the
    # (waiting - 1) other copies stay too.
    name = "output head's backward: the weight's bf16 copy and bf16 gradient"
    terms += (Term(name, head * (waiting + 1), "head backward"),)
    return terms
