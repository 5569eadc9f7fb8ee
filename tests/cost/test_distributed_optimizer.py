"""ZeRO-1 as Megatron-Core's distributed optimizer runs it (``megatron-core-2024``): gradients
reduce-scattered and parameters all-gathered in buckets, each behind compute, against torch's
all-reduce and per-tensor broadcasts (planc's program) and an all-reduce + all-gather
(``megatron-lm-2021``'s ZeRO-1)."""

import math
from dataclasses import replace

import pytest

from planc.cost import PROFILES, evaluate
from planc.cost.params import stage_params
from planc.spec import Layout, build_plan
from planc.strategies.registry import load_registry
from planc.strategies.zero1.cost_pass import megatron_bucket_params

CORE = PROFILES["megatron-core-2024"]


def _plan(model: dict, nodes: int = 1, batch: int = 64):
    return build_plan(
        {
            "model": model,
            "hardware": {"device": "H100-SXM", "nodes": nodes},
            "train": {"global_batch": batch, "precision": "bf16"},
        }
    )


def _dp_traffic(plan, profile, dp: int, micro_batch: int = 1):
    layout = Layout(tp=1, pp=1, dp=dp, zero=1, recompute="none", schedule=None, micro_batch=micro_batch)
    est = evaluate(plan, layout, load_registry().passes(plan, layout), profile=profile)
    return est.comm_of("dp")


def test_megatron_bucket_size_grows_with_the_data_parallel_group():
    # DistributedDataParallelConfig.bucket_size: max(40,000,000, 1,000,000 x dp) parameters
    assert megatron_bucket_params(8) == 40_000_000
    assert megatron_bucket_params(40) == 40_000_000
    assert megatron_bucket_params(48) == 48_000_000


def test_reduce_scatter_and_all_gather_move_six_bytes_where_all_reduce_and_all_gather_move_ten():
    """fp32 gradients (4 bytes, reduced once) + bf16 parameters (2), against an all-reduce's two
    passes over the fp32 gradients (8) + the same all-gather: 6/10, whatever the model."""
    plan = _plan({"preset": "llama3-8b", "seq_len": 2048})
    scattered = _dp_traffic(plan, CORE, dp=8)
    reduced = _dp_traffic(plan, replace(CORE, distributed_optimizer=False), dp=8)
    assert scattered.volume / reduced.volume == pytest.approx(6 / 10)
    params = stage_params(plan.model, 1, 1, 1, 0).params
    assert scattered.volume == pytest.approx(7 / 8 * 6 * params)
    assert "reduce-scatter" in scattered.detail and "all-gather" in scattered.detail


def test_one_bucket_is_waited_for_whole():
    """A model under one bucket (40 M parameters): the backward's last bucket and the forward's
    first are the whole traffic, so nothing hides."""
    plan = _plan({"layers": 2, "hidden": 512, "heads": 8, "vocab": 8192, "seq_len": 512})
    assert stage_params(plan.model, 1, 1, 1, 0).params < 40_000_000
    dp = _dp_traffic(plan, CORE, dp=8)
    assert dp.exposed == pytest.approx(dp.total)


def test_many_buckets_behind_long_compute_leave_one_bucket_of_each_exposed():
    """Llama 3 8B, 8 ranks in one node, 8 sequences of 2048 tokens per micro-batch: the backward
    and forward take far longer than the traffic, so what is exposed is the last reduce-scatter
    bucket and the first all-gather bucket, each a ring over NVLink at the share of its line rate
    that NCCL moves: (p - 1) alpha + (p - 1)/p * bytes / beta (Thakur et al. 2005)."""
    plan = _plan({"preset": "llama3-8b", "seq_len": 2048}, batch=64)
    hw = plan.hardware
    params = stage_params(plan.model, 1, 1, 1, 0).params
    buckets = math.ceil(params / 40_000_000)
    alpha, beta, p = hw.intra_node_latency, hw.intra_node_bw * 0.82, 8  # H100's NVLink4: 370 of 450 GB/s

    def ring(nbytes):
        return (p - 1) * alpha + (p - 1) / p * nbytes / beta

    dp = _dp_traffic(plan, CORE, dp=8, micro_batch=8)
    assert dp.total == pytest.approx(buckets * (ring(4 * params / buckets) + ring(2 * params / buckets)))
    assert dp.exposed == pytest.approx(ring(4 * params / buckets) + ring(2 * params / buckets))


def test_without_overlap_everything_is_exposed():
    plan = _plan({"preset": "llama3-8b", "seq_len": 2048}, batch=64)
    dp = _dp_traffic(plan, replace(CORE, dp_overlap=False), dp=8, micro_batch=8)
    assert dp.exposed == pytest.approx(dp.total)


def test_planc_program_keeps_torchs_all_reduce_and_broadcasts():
    plan = _plan({"preset": "llama3-8b", "seq_len": 2048})
    dp = _dp_traffic(plan, PROFILES["planc"], dp=8)
    assert "broadcast" in dp.detail and "all-reduce" in dp.detail
