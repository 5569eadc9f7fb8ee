"""FLOPs, collectives and kernel times: hand-derived values."""

import math

import pytest

from planc.cost import evaluate
from planc.cost.comm import (
    all_gather_seconds,
    all_reduce_seconds,
    broadcasts_seconds,
    p2p_seconds,
    reduce_scatter_seconds,
)
from planc.cost.compute import Device, gemm_seconds, wave_efficiency
from planc.cost.flops import hardware_flops_per_step, model_flops_per_step, narayanan_eq3
from planc.hardware import GroupLink
from planc.spec import Layout, build_plan
from planc.strategies.registry import load_registry
from planc.units import Quantity


def test_narayanan_eq3_for_their_gpt():
    # l = 2, h = 128, s = 64, V = 256, B = 4: 96 B s l h^2 (1 + s/6h + V/16lh)
    m = build_plan(
        {
            "model": dict(layers=2, hidden=128, heads=4, vocab=256, seq_len=64, vocab_multiple=1),
            "hardware": {"device": "cpu"},
            "train": {"global_batch": 4},
        }
    ).model
    tokens = 4 * 64
    expected = 96 * 4 * 64 * 2 * 128**2 * (1 + 64 / (6 * 128) + 256 / (16 * 2 * 128))
    assert narayanan_eq3(4, 64, 2, 128, 256) == pytest.approx(expected)
    assert hardware_flops_per_step(m, tokens, "full") == pytest.approx(expected)
    # without recomputation: 72 B s l h^2 (1 + s/6h + V/(12 l h))
    assert model_flops_per_step(m, tokens) == pytest.approx(
        72 * 4 * 64 * 2 * 128**2 * (1 + 64 / (6 * 128) + 256 / (12 * 2 * 128))
    )
    # selective, fused attention: one more attention-out GEMM per block, 2 h^2 per token
    assert hardware_flops_per_step(m, tokens, "selective") == pytest.approx(
        model_flops_per_step(m, tokens) + 2 * 2 * 128**2 * tokens
    )
    # selective, materialized attention (Korthikanti): the scores and attention over values again, 4 s h
    assert hardware_flops_per_step(m, tokens, "selective", "materialized") == pytest.approx(
        model_flops_per_step(m, tokens) + 2 * 4 * 64 * 128 * tokens
    )


LINK = GroupLink(size=4, bandwidth=100e9, latency=1e-5, nodes=1, per_node=4)


def test_ring_collectives():
    n = 1e9
    # ring all-reduce: 2 (p-1) alpha + 2 (p-1)/p n / beta = 6e-5 + 1.5e-2; tree: 4 alpha + 2e-2
    assert all_reduce_seconds(n, LINK) == pytest.approx(6e-5 + 0.015)
    # reduce-scatter and all-gather: 3 alpha + 0.75 n / beta
    assert reduce_scatter_seconds(n, LINK) == pytest.approx(3e-5 + 0.0075)
    assert all_gather_seconds(n, LINK) == reduce_scatter_seconds(n, LINK)
    assert p2p_seconds(n, LINK) == pytest.approx(1e-5 + 0.01)
    one = GroupLink(size=1, bandwidth=float("inf"), latency=0.0, nodes=1, per_node=1)
    assert all_reduce_seconds(n, one) == 0.0


def test_parameter_by_parameter_broadcasts():
    """ZeroRedundancyOptimizer's sync: 40 broadcasts fill a 1 GB buffer over 4 ranks: the bytes of
    one all-gather (0.75 n / beta = 7.5 ms) and 40 tree latencies of log2(4) = 2 hops (40 x 2 x 1e-5)."""
    assert broadcasts_seconds(40, 1e9, LINK) == pytest.approx(40 * 2 * 1e-5 + 0.0075)
    assert broadcasts_seconds(1, 1e9, LINK) < all_gather_seconds(1e9, LINK)  # one tree beats the ring's 3 hops


def test_zero1_prices_one_broadcast_per_rank_for_planc_s_program():
    """planc's ZeRO-1 builds its buffers as bucket views: the step's parameter sync is one broadcast
    per data-parallel rank, each a tree of ceil(log2 8) = 3 hops. ZeRO-1's DP time less DDP's (in
    fp32 both run DDP's bucketed gradient all-reduce) is that sync; with the latency raised by d it
    grows by 8 x 3 x d, not by a latency per parameter tensor (GPT-2 has over 100)."""

    def dp_seconds(zero: int, microseconds: float) -> float:
        latency = Quantity.of(microseconds, "us")
        p = build_plan(
            {
                "model": {"preset": "gpt2"},
                "hardware": {"device": "A100-80GB", "per_node": 8, "intra_node_latency": latency},
                "train": {"global_batch": 64, "precision": "fp32"},
            }
        )
        lay = Layout(tp=1, pp=1, dp=8, zero=zero, recompute="none", schedule=None, micro_batch=8)
        return evaluate(p, lay, load_registry().passes(p, lay)).comm_of("dp").total

    def sync_seconds(microseconds: float) -> float:
        return dp_seconds(1, microseconds) - dp_seconds(0, microseconds)

    assert sync_seconds(20) - sync_seconds(10) == pytest.approx(8 * 3 * 10e-6)


def test_tree_wins_for_small_messages_on_many_ranks():
    big = GroupLink(size=1024, bandwidth=25e9, latency=1e-5, nodes=1024, per_node=1)
    # ring latency 2 x 1023 x 1e-5 = 20 ms; tree 2 x 10 x 1e-5 = 0.2 ms
    n = 1e6
    tree = 2 * 10 * 1e-5 + 2 * n / 25e9
    assert all_reduce_seconds(n, big) == pytest.approx(tree)


def test_wave_quantization():
    # 108 SMs. M = 2048, N = 2304: best of 256x128 (8 x 18 = 144 tiles, 1.33 waves -> 0.67),
    # 128x256 (16 x 9 = 144, same) and 128x128 (16 x 18 = 288 tiles, 2.67 waves -> 0.89).
    assert wave_efficiency(2048, 2304, 108) == pytest.approx(288 / 108 / 3)
    # full waves: 128x128 tiles, M = 1536, N = 1152: 12 x 9 = 108 tiles = exactly one wave
    assert wave_efficiency(1536, 1152, 108) == 1.0
    assert wave_efficiency(10, 10, None) == 1.0  # CPUs have no waves


def test_gemm_roofline():
    dev = Device(peak=100e12, efficiency=0.5, hbm_bw=1e12, sms=None)
    # compute-bound: 2 x 4096^3 / 50e12
    assert gemm_seconds(4096, 4096, 4096, dev, 2) == pytest.approx(2 * 4096**3 / 50e12)
    # memory-bound (K = 1): bytes 2 (m + n + m n) over 0.85 TB/s
    m = n = 4096
    assert gemm_seconds(m, 1, n, dev, 2) == pytest.approx(2 * (m + n + m * n) / (1e12 * 0.85))
    assert math.isclose(gemm_seconds(64, 64, 64, dev, 2, batch=8), 8 * gemm_seconds(64, 64, 64, dev, 2))


def test_a_switch_all_reduce_sends_each_buffer_once_and_wins_only_past_two_ranks():
    """NVLS: 2 alpha + n / beta_switch, whatever the group's size; a ring's 2 (p-1)/p n / beta grows
    toward 2 n / beta. With beta = 369 GB/s (NVLink4 as NCCL moves it) and beta_switch = 275 GB/s:"""
    n = 1e9

    def link(p):
        return GroupLink(size=p, bandwidth=369e9, latency=1e-5, nodes=1, per_node=p, switch_all_reduce_bw=275e9)

    switch = 2e-5 + n / 275e9  # 3.66 ms
    assert all_reduce_seconds(n, link(8)) == pytest.approx(switch)  # ring: 1.75 n / beta = 4.74 ms
    assert all_reduce_seconds(n, link(4)) == pytest.approx(switch)  # ring: 1.5 n / beta = 4.07 ms
    assert all_reduce_seconds(n, link(2)) == pytest.approx(2e-5 + n / 369e9)  # ring: n / beta = 2.71 ms


def test_the_step_summary_is_one_gather_up_to_64_ranks_then_two_all_reduces():
    """planc.runtime.step_summary: every rank's loss share, stop vote and peak memory (3 float64)
    in one ring all-gather: on 4 ranks 3 alpha + 0.75 x 96 bytes / beta; on 1024 ranks a tree
    all-reduce of 16 bytes and one of 8 (2 x 10 alpha + 2 n / beta each); on one rank nothing."""
    from planc.cost.comm import SUMMARY_GATHER_RANKS, step_summary_seconds
    from planc.runtime.step_summary import GATHER_RANKS

    assert SUMMARY_GATHER_RANKS == GATHER_RANKS
    assert step_summary_seconds(LINK) == pytest.approx(3e-5 + 0.75 * 96 / 100e9)
    big = GroupLink(size=1024, bandwidth=25e9, latency=1e-5, nodes=1024, per_node=1)
    assert step_summary_seconds(big) == pytest.approx(2 * (2 * 10 * 1e-5) + 2 * 16 / 25e9 + 2 * 8 / 25e9)
    one = GroupLink(size=1, bandwidth=float("inf"), latency=0.0, nodes=1, per_node=1)
    assert step_summary_seconds(one) == 0.0


def test_every_multi_rank_step_pays_its_summary_over_every_rank():
    """The summary spans the world, not one group: a TP 2 x DP 4 layout on two 4-GPU nodes
    gathers across the network (inter-node latency), and one GPU pays nothing."""
    from planc.cost.comm import step_summary_seconds
    from planc.cost.context import build_context
    from planc.cost.driver import SUMMARY_NAME

    def plan(nodes: int, per_node: int):
        return build_plan(
            {
                "model": {"preset": "gpt2"},
                "hardware": {"device": "A100-80GB", "nodes": nodes, "per_node": per_node},
                "train": {"global_batch": 64},
            }
        )

    p = plan(2, 4)
    lay = Layout(tp=2, pp=1, dp=4, zero=0, recompute="none", schedule=None, micro_batch=8)
    est = evaluate(p, lay, load_registry().passes(p, lay))
    world = build_context(p, lay).links["world"]
    assert world.size == 8 and world.nodes == 2
    assert est.step_parts()[SUMMARY_NAME] == pytest.approx(step_summary_seconds(world))
    assert step_summary_seconds(world) > step_summary_seconds(build_context(p, lay).links["tp"])
    single = plan(1, 1)
    one = Layout(tp=1, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=8)
    assert SUMMARY_NAME not in evaluate(single, one, load_registry().passes(single, one)).step_parts()
