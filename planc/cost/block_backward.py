"""What a block's backward holds beside the activations the blocks saved, and when.

A block's backward (the ``"backward"`` phase of :class:`~planc.cost.estimate.StageMemory`) starts
when the gradient of its output arrives: the residual stream's gradient, which the block's last
add hands to both of its branches and which stays until the block's first add consumes it, and
the MLP branch's copy of it, gathered over the sequence under SP and cast to the compute dtype
under autocast. The MLP's output projection then writes the gradients of its input and weight.

Under recomputation the backward starts by rerunning the block's forward (the ``"recompute"``
phase): torch's non-reentrant checkpoint reruns it until the last tensor the block saves is saved
again (its early stop), at the MLP's output projection, where the MLP's input is still alive as a
local of the forward -- under autocast the fp32 norm output (gathered under SP) that the bf16
copies the MLP's GEMMs saved were cast from. The output projection's gradients come after, when
that input is gone. The two moments hold different bytes beside the same ones (the block's
rerun activations, its weights' bf16 copies, the incoming gradient): terms held through both
name both phases (:func:`through_backward`).

Found by ``planc verify --simulate`` of a TP 8 + SP stand-in (2 blocks, hidden 128; every live
tensor listed at the peak, ``torch.distributed._tools.mem_tracker``): the peak of full and selective
recomputation was the rerun's end, with the MLP's fp32 input (128 KiB) beside the rerun's bf16
copies and the residual stream's gradient, none of which the model held; it predicted the peak
6.5-7.4 % low (bf16 and fp32), against -1.0 % without recomputation.
"""

from __future__ import annotations

from planc.cost.context import CostContext
from planc.cost.estimate import PHASES_JOINED, Term
from planc.cost.params import StageParams
from planc.spec import ModelSpec

#: :attr:`~planc.cost.estimate.Term.phase` of a recomputed block's rerun forward, at its end.
RECOMPUTE = "recompute"
#: :attr:`~planc.cost.estimate.Term.phase` of a block's backward proper.
BACKWARD = "backward"


def through_backward(recompute: str) -> str:
    """The phase of bytes held from a block's backward's start to its end: with recomputation
    the rerun's end too."""
    return BACKWARD if recompute == "none" else PHASES_JOINED.join((RECOMPUTE, BACKWARD))


def block_backward_bytes(model: ModelSpec, tokens: int, tp: int, e: int, split: bool = False) -> float:
    """Bytes a block's backward holds beside the activations it saved, as it starts: its last
    linear (the MLP's output projection) writes the gradient of its input, ``[tokens, ffn / tp]``,
    and of its weight, ``[hidden, ffn / tp]``, both in compute precision, before either is passed
    on -- the weight's to be added to ``.grad`` (in fp32 under autocast, whose cast autograd runs
    later), the input's into the activation function's backward, which frees what the forward
    saved. ``planc verify --simulate`` found a pipeline's first stage (Llama 3 8B, 1F1B) peak
    there, at the MLP's output projection, with these two and the incoming gradient
    (:func:`incoming_gradient_terms`) as its only temporaries. Zero-bubble's split backward
    (``split``) writes the input's gradient in its input pass and the weight's in its weight pass,
    never both at once: the larger of the two."""
    return e * model.ffn / tp * (max(tokens, model.hidden) if split else tokens + model.hidden)


def incoming_gradient_terms(ctx: CostContext, phase: str, received: bool = False) -> tuple[Term, ...]:
    """The gradient of the block's output, held in ``phase``.

    The residual stream's, ``r T h`` (over ``tp`` under SP) -- unless ``received``: the block
    whose backward starts with every activation is its stage's last, whose output gradient a
    pipeline stage before the last receives into a buffer the pipeline pass prices (simulated,
    PP 2, ZeRO-2, fp32: +2.0 % on the first rank with it counted twice, +1.3 % without); the MLP
    branch's, ``e T h`` over the whole sequence, is a tensor of its own where SP all-gathers it or
    autocast casts it to bf16 (else the branch uses the residual stream's own)."""
    lay, model, tokens = ctx.layout, ctx.model, ctx.tokens_per_microbatch
    e, r = ctx.compute_bytes, ctx.residual_bytes
    sp = lay.sequence_parallel and lay.tp > 1
    residual = r * tokens * model.hidden / (lay.tp if sp else 1)
    terms: tuple[Term, ...] = ()
    if not received:
        terms = (Term("block backward: the residual stream's gradient", residual, phase),)
    if sp or e != r:
        how = " and ".join(w for w, on in (("gathered", sp), ("cast to compute precision", e != r)) if on)
        terms += (Term(f"block backward: its output gradient, {how}", e * tokens * model.hidden, phase),)
    return terms


def rerun_mlp_input_bytes(ctx: CostContext) -> float:
    """Bytes of the MLP's input alive at a recomputed block's rerun end beside what the rerun
    saved: under autocast the fp32 norm output its GEMMs' bf16 copies were cast from (the whole
    sequence: gathered under SP, replicated under TP); none where the GEMMs save that input itself."""
    if ctx.layout.recompute == "none" or ctx.compute_bytes == ctx.residual_bytes:
        return 0.0
    return ctx.residual_bytes * ctx.tokens_per_microbatch * ctx.model.hidden


def block_backward_terms(ctx: CostContext, st: StageParams) -> tuple[Term, ...]:
    """What a block's backward holds on stage ``st`` beside the saved activations, by phase."""
    if not st.layers:
        return ()
    lay = ctx.layout
    fsdp = _fsdp_prices_the_block_end(ctx)
    terms: tuple[Term, ...] = ()
    if not (fsdp and lay.recompute == "none"):
        # FSDP's own "backward" term is the block's end, every gradient of it gathered for the
        # reduce-scatter beside two blocks' parameters: more than this start of it, and not at once
        # (the Llama 3 FSDP simulations were within 1% without the output projection's gradients,
        # +0.8% with them at 8B; the CPU matrix's FSDP rows +2.4 -> +3.1 % with the incoming
        # gradients); a recomputed block's rerun end comes before it.
        phase = RECOMPUTE if fsdp else through_backward(lay.recompute)
        terms = incoming_gradient_terms(ctx, phase, received=lay.pp > 1 and not st.head)
    mlp_input = rerun_mlp_input_bytes(ctx)
    if mlp_input:
        terms += (Term("recompute: the MLP's fp32 input, alive at the rerun's end", mlp_input, RECOMPUTE),)
    if fsdp:
        return terms
    split = lay.schedule == "zero-bubble" and lay.pp > 1
    working = block_backward_bytes(ctx.model, ctx.tokens_per_microbatch, lay.tp, ctx.compute_bytes, split)
    return (*terms, Term("block backward: the MLP output projection's gradients", working, BACKWARD))


def _fsdp_prices_the_block_end(ctx: CostContext) -> bool:
    """Whether FSDP's own "backward" term is a block's end, larger than its start: every gradient
    of the block in compute precision beside its gathered parameters -- except under a pipeline's
    deferred reduction in fp32, where autograd adds each new gradient into the accumulation as it
    comes and the block's end holds one parameter's (the start's own)."""
    lay = ctx.layout
    if lay.zero < 2 or lay.dp == 1:
        return False
    return not (lay.pp > 1 and ctx.micro_batches > 1 and ctx.compute_bytes == ctx.grad_reduce_bytes)
