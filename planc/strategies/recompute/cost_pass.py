"""The plan-time cost pass of ``recompute`` (pure; no torch)."""

from __future__ import annotations

from planc.cost.block_backward import through_backward
from planc.cost.context import CostContext
from planc.cost.estimate import CommCost, Estimate, StageMemory, Term
from planc.cost.frozen import replace
from planc.cost.wrappers import recompute_seconds, with_wrapper_time
from planc.strategies.tensor_parallel.cost_pass import last_forward_collective, sp_regather, tp_block_collectives


def cost(ctx: CostContext, est: Estimate, options: object = None) -> Estimate:
    """Activation recomputation (Chen et al. 2016; Korthikanti et al. 2022, Sec. 4.3, Table 2).

    - selective: blocks keep ``layer_act.selective`` bytes; recomputing costs
      ``layer.selective_recompute`` per block and micro-batch (planc's policy: the elementwise
      kernels and the attention-out GEMM); under SP also the two all-gathers of the sub-layer
      inputs, rerun instead of kept (:func:`sp_regather`).
    - full: blocks keep only their input; the backward of each block first reruns its forward
      (one more forward of every block: Narayanan's 4 passes instead of 3), which under TP also
      reruns the forward's two all-reduces; one block's full activations are alive while it is
      recomputed (the working set, held from the rerun's end through the block's backward, the
      "recompute" and "backward" phases of :mod:`planc.cost.block_backward`, not beside the
      loss's buffers); the kept input is among those activations, saved again as itself.
    """
    mode = ctx.layout.recompute
    if mode == "none":
        return est
    m = ctx.micro_batches
    layers = ctx.stage(ctx.slowest.rank).layers
    comm = None
    phase = through_backward(mode)  # from the rerun's end through the block's backward
    if mode == "selective":
        per_layer, extra = ctx.layer_act.selective, m * layers * ctx.layer.selective_recompute
        # What the block's backward reruns is alive beside what it kept, while it runs
        rerun = (Term("selective recompute working set (one block)", ctx.layer_act.none - per_layer, phase),)

        def stage_fn(s: StageMemory) -> StageMemory:
            return s.updated(act_per_layer=per_layer, extra=rerun)

        comm = _with_regather(ctx, est)
    else:
        per_layer, extra = ctx.layer_act.full, m * layers * ctx.layer.forward
        # The rerun saves the kept input again as itself, not a copy: the rest is the working set
        working = (Term("recompute working set (one block)", ctx.layer_act.none - per_layer, phase),)

        def stage_fn(s: StageMemory) -> StageMemory:
            return s.updated(act_per_layer=per_layer, extra=working)

        tp = est.comm_of("tp")
        if tp is not None:
            fwd, _, sent = tp_block_collectives(ctx)
            rerun_s, rerun_sent, words = fwd, sent / 2, "+2 in the recomputed forward"
            if ctx.profile.recompute_early_stop:  # the block's last collective is not rerun
                skipped, skipped_sent = last_forward_collective(ctx)
                rerun_s, rerun_sent = fwd - skipped, rerun_sent - skipped_sent
                words = "the recomputed forward's, but its last (checkpoint's early stop)"
            comm = _with_rerun_traffic(ctx, tp, rerun_s, rerun_sent, words)
    est = est.updated(stage_fn=stage_fn, comm=comm, compute=est.compute + extra, recompute=est.recompute + extra)
    return with_wrapper_time(est, _WRAPPER, recompute_seconds(ctx), per_micro_batch=True)


_WRAPPER = "activation checkpointing's own work (measured)"


def _with_regather(ctx: CostContext, est: Estimate) -> CommCost | None:
    """The TP traffic with selective recomputation's extra all-gathers under SP (None: no change)."""
    tp = est.comm_of("tp")
    seconds, sent = sp_regather(ctx)
    if tp is None or seconds == 0.0:
        return None
    return _with_rerun_traffic(ctx, tp, seconds, sent, "+2 all-gathers rerun in backward")


def _with_rerun_traffic(ctx: CostContext, tp: CommCost, seconds: float, sent: float, words: str) -> CommCost:
    """``tp`` with ``seconds`` and ``sent`` bytes more per block and micro-batch, on the rank with
    the most blocks (and each rank's own blocks, where the estimate states each rank's bytes)."""
    m = ctx.micro_batches
    blocks = m * max(st.layers for st in ctx.stages)
    by_rank = tuple(v + m * st.layers * sent for v, st in zip(tp.volume_by_pp_rank, ctx.stages_by_pp_rank, strict=True))
    return replace(
        tp,
        total=tp.total + blocks * seconds,
        exposed=tp.exposed + blocks * seconds,
        volume=tp.volume + blocks * sent,
        detail=f"{tp.detail}, {words}",
        volume_by_pp_rank=by_rank,
    )
