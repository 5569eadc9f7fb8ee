"""Cost passes: the built-ins run in composition order, and a third-party pass can add or
change a term (what a strategy plugin's ``cost(ctx, estimate, options)`` does)."""

import pytest

from planc.cost import CostPass, evaluate
from planc.cost.frozen import replace
from planc.spec import Layout, build_plan
from planc.strategies.registry import load_registry
from planc.units import format_bytes


def plan():
    return build_plan(
        {
            "model": {"preset": "gpt2-medium"},
            "hardware": {"device": "A100-80GB", "nodes": 2},
            "train": {"global_batch": 64},
        }
    )


def layout(**kw):
    base = dict(tp=2, pp=2, dp=4, zero=0, recompute="full", schedule="1f1b", micro_batch=2)
    base.update(kw)
    return Layout(**base)


def test_active_passes_in_composition_order():
    names = [p.name for p in load_registry().passes(plan(), layout())]
    assert names == ["pipeline", "tensor_parallel", "recompute", "bf16", "ddp"]
    assert [p.name for p in load_registry().passes(plan(), layout(zero=1))][-1] == "zero1"
    assert [p.name for p in load_registry().passes(plan(), layout(zero=3))][-1] == "fsdp"
    single = Layout(tp=1, pp=1, dp=16, zero=2, recompute="none", schedule=None, micro_batch=1)
    assert [p.name for p in load_registry().passes(plan(), single)] == ["bf16", "fsdp"]


def powersgd(ctx, est, options):
    """A fake PowerSGD: compresses the gradient all-reduce by ``options['ratio']``."""
    dp = est.comm_of("dp")
    return est.with_comm(dp.scaled(options["ratio"]))


def cpu_offload(ctx, est, options):
    """A fake optimizer offload: states leave the device; copying them costs host-link time."""
    moved = max(s.optimizer + s.master for s in est.stages)
    est = est.map_stages(lambda s: replace(s, optimizer=0.0, master=0.0))
    return est.with_time("optimizer state transfers over PCIe", 2 * moved / options["pcie_bw"])


def test_a_plugin_pass_scales_dp_traffic():
    p, lay = plan(), layout()
    passes = load_registry().passes(p, lay)
    base = evaluate(p, lay, passes)
    compressed = evaluate(p, lay, passes.plus(CostPass("powersgd", powersgd, {"ratio": 0.1})))
    before, after = base.comm_of("dp"), compressed.comm_of("dp")
    assert after.volume == pytest.approx(0.1 * before.volume)
    assert after.exposed == pytest.approx(0.1 * before.exposed)
    assert compressed.step_s == pytest.approx(base.step_s - 0.9 * before.exposed)


def test_a_plugin_pass_moves_optimizer_memory_off_the_device():
    p, lay = plan(), layout()
    passes = load_registry().passes(p, lay)
    base = evaluate(p, lay, passes)
    off = evaluate(p, lay, passes.plus(CostPass("offload", cpu_offload, {"pcie_bw": 25e9})))
    assert off.memory.optimizer == 0
    # the allocator margin is 5% of the rest, so the saving is 1.05 x the states
    saved = base.memory.optimizer + base.memory.master
    assert base.memory_bytes - off.memory_bytes == pytest.approx(1.05 * saved, rel=1e-6)
    assert off.step_s > base.step_s
    assert dict((t.name, t.value) for t in off.other)["optimizer state transfers over PCIe"] > 0


def test_passes_do_not_mutate_their_input():
    p, lay = plan(), layout()
    from planc.cost import base_estimate, build_context

    ctx = build_context(p, lay)
    est = base_estimate(ctx)
    snapshot = (est.stages, est.compute, est.comm)
    for cp in load_registry().passes(p, lay):
        cp.cost(ctx, est, cp.options)
    assert (est.stages, est.compute, est.comm) == snapshot


@pytest.mark.parametrize("precision, dtype, mib", [("bf16", "bf16", 2), ("fp32", "fp32", 4)])
def test_tp_traffic_names_the_activations_dtype(precision, dtype, mib):
    """The TP row says what one activation collective moves, in the dtype it moves: micro-batch 2 x
    1024 tokens x hidden 1024 (gpt2-medium) x 2 or 4 bytes = 4 or 8 MiB."""
    fp32_or_bf16 = plan().model_copy(update={"train": plan().train.model_copy(update={"precision": precision})})
    registry = load_registry()
    est = evaluate(fp32_or_bf16, layout(), registry.passes(fp32_or_bf16, layout()))
    assert f"({2 * mib}.0 MiB in {dtype})" in est.comm_of("tp").detail


def test_pipeline_traffic_is_priced_on_its_slowest_boundary():
    # Llama 3 8B on 2 nodes x 8 H100 with a 1 GB/s network, TP 2 x PP 4 x DP 2: stage s holds
    # ranks 4s .. 4s + 3, so the boundary between stages 1 and 2 crosses nodes (not the first one).
    from planc.units import Quantity

    p = build_plan(
        {
            "model": {"preset": "llama3-8b", "seq_len": 8192},
            "hardware": {"device": "H100-SXM", "nodes": 2, "inter_node_bw": Quantity.of(1, "GB/s")},
            "train": {"global_batch": 64, "micro_batch": 1},
        }
    )
    lay = Layout(tp=2, pp=4, dp=2, zero=2, schedule="1f1b", recompute="none", micro_batch=1)
    pp = evaluate(p, lay, load_registry().passes(p, lay)).comm_of("pp")
    # one boundary tensor: 8192 tokens x 4096 x 2 B = 64 MiB; over one 1 GB/s NIC, of which NCCL
    # moves 96% (planc.spec.presets.hardware), after a 10 us start-up
    crossing = 10e-6 + 8192 * 4096 * 2 / (1e9 * 0.96)
    # 64 / (dp 2 x micro-batch 1) = 32 micro-batches, each sent forward and its gradient back;
    # then the gradient norm's 4-byte all-reduce over the 4 stages (ranks 4 apart, on both nodes):
    # a tree's 2 log2(4) start-ups of 10 us beat the ring's 2 (4 - 1)
    norm = 2 * 2 * 10e-6
    assert pp.medium == "network"
    assert pp.total == pytest.approx(2 * 32 * crossing + norm)
    # the first micro-batch's warm-up and the last one's cool-down cross the slow boundary at least
    assert pp.exposed >= 2 * crossing


def _interleaved_pp2():
    """The review's plan (finding 7): Llama 3 8B at 4096 tokens on 2 H100 nodes, TP 4 x PP 2 x DP 2,
    interleaved with 2 chunks per rank, 64 / (dp 2 x micro-batch 1) = 32 micro-batches."""
    from planc.cost import build_context

    p = build_plan(
        {
            "model": {"preset": "llama3-8b", "seq_len": 4096},
            "hardware": {"device": "H100-SXM", "nodes": 2},
            "train": {"global_batch": 64, "micro_batch": 1},
        }
    )
    lay = Layout(
        tp=4,
        pp=2,
        dp=2,
        zero=1,
        recompute="selective",
        schedule="interleaved",
        virtual_stages=2,
        sequence_parallel=True,
        micro_batch=1,
    )
    return evaluate(p, lay, load_registry().passes(p, lay)), build_context(p, lay)


def test_pipeline_receive_buffers_say_what_they_count():
    """Rank 0 holds stages 0 and 2 of 4: stage 2 receives each micro-batch's activation (32),
    both receive each one's gradient (64). The label said "96 = one per chunk-micro-batch", of
    which rank 0 has 64."""
    est, ctx = _interleaved_pp2()
    # one boundary tensor: 4096 tokens x 4096 x 4 B (the fp32 residual stream) / TP 4 (SP) = 16 MiB
    assert ctx.boundary_bytes == 4096 * 4096 * 4 / 4
    rank0 = next(s for s in est.stages if s.rank == 0)
    (term,) = [t for t in rank0.transient if t.name.startswith("pipeline receive buffers")]
    assert term.name == "pipeline receive buffers (32 activation + 64 gradient, one per chunk-micro-batch received)"
    assert term.value == 96 * 16 * 2**20


def test_pipeline_transfers_with_two_ranks_count_the_wrap_too():
    """With pp = 2 the wrap from stage 1 (rank 1) to stage 2 (rank 0) joins the same two ranks as
    stages 0 -> 1 and 2 -> 3: 3 boundaries x 32 micro-batches x (activation + gradient) = 192
    transfers of 16 MiB between them, 96 each way (torch's schedule: rank 0 sends 64 activations
    and 32 gradients); the row said 2 m v = 128 and "0.0 MiB" for a CPU plan's 32 KiB."""
    est, _ = _interleaved_pp2()
    pp = est.comm_of("pp")
    # and the gradient norm's fp32 all-reduce over the 2 stages: 2 (2 - 1)/2 x 4 bytes
    assert pp.volume == 192 * 16 * 2**20 + 4
    assert pp.detail.startswith("192 p2p transfers of 16.0 MiB per step")
    assert "(96 each way)" in pp.detail


def test_detail_lines_print_bytes_in_a_unit_that_shows_them():
    """cpu-3d (TP 2 x PP 2 x DP 2, 1F1B, SP, fp32; micro-batch 2 x 64 tokens, hidden 128): the
    details read "0.00 GiB", "0.0 MiB" and "0 MiB" beside a per-step column of KiB (finding 8)."""
    from pathlib import Path

    from planc.dsl.load import load_plan

    registry = load_registry()
    p = load_plan(Path(__file__).resolve().parents[2] / "plans" / "cpu-3d.plan", strategies=registry)
    from planc.planner import choose

    est = choose(p, registry).estimate
    # TP: one activation, 2 x 64 tokens x 128 x 4 B = 64 KiB
    assert "(64.0 KiB in fp32)" in est.comm_of("tp").detail
    # PP: the same tensor over the 2 TP ranks under SP = 32 KiB, 2 x 4 micro-batches x 1 boundary
    assert est.comm_of("pp").detail.startswith("8 p2p transfers of 32.0 KiB per step")
    # DP over 2: a ring all-reduce moves 2 (2 - 1) / 2 = 1 x the gradients it reduces
    dp = est.comm_of("dp")
    assert dp.detail.startswith(f"all-reduce of {format_bytes(dp.volume)} fp32 gradients")


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_full_recomputation_reruns_the_forward_collectives_but_the_last(sequence_parallel):
    """torch's non-reentrant checkpoint stops its rerun once backward's tensors are back, so a
    block's last forward collective -- the MLP's output all-reduce, or its reduce-scatter under SP
    -- is not rerun (planc verify on 8 CPU ranks, TP 8 + SP: 2 all-gathers and 1 reduce-scatter
    more per recomputed block). Megatron-LM's reentrant checkpoint reruns all of the layer's.
    By hand, per block and micro-batch, T tokens x h, e = r = 4 bytes (fp32 over TP 2, no DP):
    forward collectives 2 all-reduces (2 (t-1)/t x 4 T h each), or 2 all-gathers and 2
    reduce-scatters ((t-1)/t x 4 T h each)."""
    from planc.cost.profile import MEGATRON_LM_2021

    fp32 = build_plan(
        {
            "model": {"layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32},
            "hardware": {"device": "A100-80GB", "per_node": 2},
            "train": {"global_batch": 8, "precision": "fp32"},
        }
    )
    registry = load_registry()

    def tp_volume(recompute: str, **profile) -> float:
        lay = Layout(tp=2, pp=1, dp=1, zero=0, recompute=recompute, schedule=None, micro_batch=2)
        lay = lay.model_copy(update={"sequence_parallel": sequence_parallel})
        return evaluate(fp32, lay, registry.passes(fp32, lay), **profile).comm_of("tp").volume

    collective = 4 * 2 * 32 * 64 * (2 - 1) / 2  # (t - 1) / t of one [2 x 32, 64] fp32 buffer
    forward = 4 * collective  # 2 all-reduces (2x each), or 2 all-gathers + 2 reduce-scatters
    last = 2 * collective if not sequence_parallel else collective
    blocks = 4 * 4  # 4 micro-batches of 2 rows, 4 blocks
    assert tp_volume("full") - tp_volume("none") == pytest.approx(blocks * (forward - last))
    megatron = tp_volume("full", profile=MEGATRON_LM_2021) - tp_volume("none", profile=MEGATRON_LM_2021)
    assert megatron == pytest.approx(blocks * forward)
