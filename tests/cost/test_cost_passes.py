"""Cost passes: the built-ins run in composition order, and a third-party pass can add or
change a term (what a strategy plugin's ``cost(ctx, estimate, options)`` does)."""

import pytest

from planc.cost import CostPass, evaluate
from planc.cost.estimate import replace
from planc.spec import Layout, build_plan
from planc.strategies.registry import load_registry


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
    assert f"({2 * mib} MiB in {dtype})" in est.comm_of("tp").detail


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
    # one boundary tensor: 8192 tokens x 4096 x 2 B = 64 MiB; over one 1 GB/s NIC after a 10 us start-up
    crossing = 10e-6 + 8192 * 4096 * 2 / 1e9
    # 64 / (dp 2 x micro-batch 1) = 32 micro-batches, each sent forward and its gradient back
    assert pp.medium == "network"
    assert pp.total == pytest.approx(2 * 32 * crossing)
    # the first micro-batch's warm-up and the last one's cool-down cross the slow boundary at least
    assert pp.exposed >= 2 * crossing
