"""Hardware profiles: the alpha-beta fit, reading a profile into a plan, and the cost model using it."""

from __future__ import annotations

import json

import pytest

from planc.calibrate.collectives import fit_alpha_beta, fit_problem, model_terms, retry_sizes
from planc.cost.compute import block_times, device_for, gemm_seconds
from planc.cost.dispatch import BLOCK_OPS
from planc.cost.profile import PLANC_RUNTIME, PLANC_RUNTIME_CPU
from planc.spec import Plan, build_plan
from planc.spec.hardware_profile import SCHEMA_VERSION, CollectiveFit, fit_notes
from planc.spec.issues import SpecError

GEMM_RATE = 40e9
MEMORY = 8e9
SECONDS_PER_OP = 10e-6


def profile_dict(**changes) -> dict:
    profile = {
        "schema_version": SCHEMA_VERSION,
        "planc_version": "test",
        "torch_version": "2.13.0",
        "created": "2026-11-23T17:00:00+00:00",
        "host": "test",
        "backend": "gloo",
        "device_kind": "cpu",
        "device_name": "test CPU",
        "world_size": 2,
        "nodes": 1,
        "per_node": 2,
        "threads": 1,
        "measured": {
            "gemm": [{"m": 64, "k": 32, "n": 32, "dtype": "fp32", "flops": GEMM_RATE}],
            "attention": [],
            "memory_bandwidth": MEMORY,
            "seconds_per_op": SECONDS_PER_OP,
        },
        "collectives": [
            {
                "kind": "all_reduce",
                "group_size": 2,
                "medium": "intra_node",
                "latency": 100e-6,
                "bandwidth": 2e9,
                "points": [[4096, 1e-3]],
            }
        ],
    }
    profile.update(changes)
    return profile


def plan_with(tmp_path, profile_file: dict | None, **hardware) -> Plan:
    if profile_file is not None:
        (tmp_path / "cal.json").write_text(json.dumps(profile_file))
        hardware.setdefault("profile", "cal.json")
    raw = {
        "model": {"layers": 2, "hidden": 32, "heads": 4, "vocab": 96, "seq_len": 16},
        "hardware": {"device": "cpu", "per_node": 2, **hardware},
        "train": {"global_batch": 8},
    }
    return build_plan(raw, base_dir=tmp_path)


def host_free_device(tmp_path):
    """The fp32 device of a profile like :func:`profile_dict`'s with no host cost per op."""
    free = profile_dict()
    free["measured"] = {**free["measured"], "seconds_per_op": 0.0}
    return device_for(plan_with(tmp_path, free).hardware, "fp32")


def cpu_blocks(model, device, free_device):
    """One fp32 block of ``model`` at micro-batch 4 on ``device`` and on ``free_device``."""
    return tuple(block_times(model, 4, 1, False, d, 4, 4, PLANC_RUNTIME_CPU) for d in (device, free_device))


def test_fit_recovers_alpha_and_beta_of_exact_points():
    # t = steps * alpha + volume / beta with alpha = 50 us, beta = 1 GB/s, for p = 4.
    for kind in ("all_reduce", "all_gather", "send_recv", "broadcast"):
        points = []
        for n in (4096, 65536, 2**20, 2**24):
            steps, volume = model_terms(kind, 4, n)
            points.append((n, steps * 50e-6 + volume / 1e9))
        alpha, beta = fit_alpha_beta(kind, 4, points)
        assert alpha == pytest.approx(50e-6, rel=1e-6)
        assert beta == pytest.approx(1e9, rel=1e-6)


def test_a_broadcast_starts_once_per_level_of_its_tree_and_delivers_the_whole_buffer():
    # from the group's first rank: ceil(log2 p) start-ups; every other rank receives all n bytes
    assert model_terms("broadcast", 2, 1000) == (1.0, 1000.0)
    assert model_terms("broadcast", 4, 1000) == (2.0, 1000.0)
    assert model_terms("broadcast", 6, 1000) == (3.0, 1000.0)


def test_fit_clamps_a_negative_latency():
    # Pure bandwidth with noise that would pull alpha below 0: alpha 0, beta near 1 GB/s.
    points = [(n, n / 1e9 * f) for n, f in ((4096, 0.5), (2**20, 1.0), (2**24, 1.0))]
    alpha, beta = fit_alpha_beta("send_recv", 2, points)
    assert alpha == 0.0
    assert 0.8e9 < beta < 2.5e9


def test_profile_fills_links_but_plan_keys_win(tmp_path):
    plan = plan_with(tmp_path, profile_dict())
    assert plan.hardware.intra_node_bw == 2e9 and plan.hardware.intra_node_latency == 100e-6
    assert plan.hardware.measured.memory_bandwidth == MEMORY
    assert "test CPU" in plan.hardware.measured.measured_on
    from planc.units import Quantity

    written = plan_with(tmp_path, profile_dict(), intra_node_bw=Quantity(5e9, "bandwidth", "5 GB/s"))
    assert written.hardware.intra_node_bw == 5e9
    # plan.json carries the measured rates: a run directory does not need the profile file.
    assert Plan.from_json(plan.to_json()).hardware.measured == plan.hardware.measured


def test_cost_model_uses_measured_rates(tmp_path):
    plan = plan_with(tmp_path, profile_dict())
    device = device_for(plan.hardware, "fp32")
    # 2 x 64 x 32 x 32 FLOP at the measured 40 GFLOP/s, no waves, no data-sheet efficiency.
    assert gemm_seconds(64, 32, 32, device, 4) == pytest.approx(2 * 64 * 32 * 32 / GEMM_RATE)
    assert device.memory_rate == MEMORY
    # On a CPU the host overhead adds to the kernels: the same profile with 0 s per op differs by
    # exactly 47 forward and 101 backward ops x 10 us (the gpt block's counts).
    free_device = host_free_device(tmp_path)
    with_ops, no_ops = cpu_blocks(plan.model, device, free_device)
    fwd_ops, bwd_ops = BLOCK_OPS[("layernorm", "gelu", "learned")]
    assert with_ops.forward - no_ops.forward == pytest.approx(fwd_ops * SECONDS_PER_OP)
    assert with_ops.backward - no_ops.backward == pytest.approx(bwd_ops * SECONDS_PER_OP)
    # Selective recomputation reruns the whole forward through the dispatcher: its host ops again.
    assert with_ops.selective_recompute - no_ops.selective_recompute == pytest.approx(fwd_ops * SECONDS_PER_OP)
    # Without a profile nothing is measured and the term is 0.
    bare = device_for(plan_with(tmp_path, None).hardware, "fp32")
    assert bare.measured is None and bare.seconds_per_op == 0.0


def test_bf16_model_ops_cost_the_measured_factor_more(tmp_path):
    # The calibration measures planc's block in bf16 over fp32 (bf16 parameters: FSDP2 and replicate;
    # autocast over fp32 parameters: planc's other bf16 programs); the model's own ops take it.
    raw = profile_dict()
    raw["measured"] = {**raw["measured"], "bf16_host_factor": 1.5, "autocast_host_factor": 2.0}
    plan = plan_with(tmp_path, raw)
    device = device_for(plan.hardware, "bf16")
    assert device.seconds_per_model_op(4, 4, 1024) == pytest.approx(SECONDS_PER_OP)  # fp32
    assert device.seconds_per_model_op(2, 2, 1024) == pytest.approx(1.5 * SECONDS_PER_OP)  # bf16 parameters
    assert device.seconds_per_model_op(2, 4, 1024) == pytest.approx(2.0 * SECONDS_PER_OP)  # autocast
    # In a block: the host part of an autocast block is the ops x 2 x the fp32 cost per op.
    fwd_ops, bwd_ops = BLOCK_OPS[("layernorm", "gelu", "learned")]
    plain = plan_with(tmp_path, profile_dict())
    plain_device = device_for(plain.hardware, "bf16")
    autocast = block_times(plan.model, 4, 1, False, device, 2, 4, PLANC_RUNTIME_CPU)
    unfactored = block_times(plain.model, 4, 1, False, plain_device, 2, 4, PLANC_RUNTIME_CPU)
    assert autocast.forward - unfactored.forward == pytest.approx(fwd_ops * SECONDS_PER_OP)
    assert autocast.backward - unfactored.backward == pytest.approx(bwd_ops * SECONDS_PER_OP)
    # A profile written before these fields reads 1: nothing changes.
    assert plain_device.measured.bf16_host_factor == 1.0 == plain_device.measured.autocast_host_factor


def test_each_collective_kind_prices_with_its_own_fit(tmp_path):
    # gloo on CPU: an all-gather's start-up ~2x and a reduce-scatter's ~4x an all-reduce's
    # (docs/accuracy.md). The link takes the all-reduce fit; the others ride along per kind.
    from planc.cost.comm import (
        all_gather_seconds,
        all_reduce_seconds,
        broadcasts_seconds,
        p2p_seconds,
        reduce_scatter_seconds,
    )
    from planc.hardware.topology import topology_for
    from planc.spec.parallel_dims import ParallelDims
    from planc.units import Quantity

    fits = [
        ("all_reduce", 100e-6, 2e9),
        ("all_gather", 200e-6, 4e9),
        ("reduce_scatter", 400e-6, 1e9),
        ("send_recv", 50e-6, 2e9),
        ("broadcast", 150e-6, 3e9),
    ]
    collectives = [
        {"kind": k, "group_size": 2, "medium": "intra_node", "latency": a, "bandwidth": b, "points": [[4096, 1e-3]]}
        for k, a, b in fits
    ]
    plan = plan_with(tmp_path, profile_dict(collectives=collectives))
    link = topology_for(plan.hardware).group("dp", ParallelDims(tp=1, pp=1, dp=2, world_size=2))
    n = 1e6
    # The cost model's ring formulas over p = 2 with each kind's (alpha, beta), by hand:
    assert all_reduce_seconds(n, link) == pytest.approx(min(2 * 100e-6 + n / 2e9, 2 * 100e-6 + 2 * n / 2e9))
    assert all_gather_seconds(n, link) == pytest.approx(200e-6 + 0.5 * n / 4e9)
    assert reduce_scatter_seconds(n, link) == pytest.approx(400e-6 + 0.5 * n / 1e9)
    assert p2p_seconds(n, topology_for(plan.hardware).p2p(0, 1)) == pytest.approx(50e-6 + n / 2e9)
    # ZeroRedundancyOptimizer's 40 broadcasts, one per tensor, filling n bytes: log2(2) = 1 start-up each
    assert broadcasts_seconds(40, n, link) == pytest.approx(40 * 150e-6 + 0.5 * n / 3e9)
    # A plan that writes the link itself is taken at its word, for every kind.
    written = plan_with(
        tmp_path, profile_dict(collectives=collectives), intra_node_latency=Quantity(1e-6, "time", "1 us")
    )
    link = topology_for(written.hardware).group("dp", ParallelDims(tp=1, pp=1, dp=2, world_size=2))
    assert reduce_scatter_seconds(n, link) == pytest.approx(1e-6 + 0.5 * n / 2e9)


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        (None, "does not exist"),
        (profile_dict(schema_version=99), "schema_version 99"),
        (profile_dict(device_kind="cuda"), "measured on cuda"),
        ({**profile_dict(), "world_size": 0}, "world_size"),
        ([1, 2, 3], "cal.json' holds a JSON list, not an object: a profile is the JSON object `planc calibrate`"),
        ({k: v for k, v in profile_dict().items() if k != "schema_version"}, "has no schema_version"),
    ],
)
def test_bad_profile_is_a_located_error(tmp_path, profile, message):
    if profile is not None:
        (tmp_path / "cal.json").write_text(json.dumps(profile))
    with pytest.raises(SpecError) as caught:
        plan_with(tmp_path, None, profile="cal.json")
    issue = caught.value.issues[0]
    assert issue.path == ("hardware", "profile")
    assert message in issue.message
    assert "planc calibrate" in issue.hint


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        # A raw tab inside a string, the 12th character: the json module's message ends "...character
        # at", expecting the place. Then a value missing at the 7th character of line 2.
        ('{"host": "a\tb"}', "is not valid JSON: Invalid control character at line 1, column 12"),
        ('{"host": "a",\n "x": }', "is not valid JSON: Expecting value at line 2, column 7"),
    ],
)
def test_a_profile_that_is_not_json_says_where(tmp_path, text, reason):
    (tmp_path / "cal.json").write_text(text)
    with pytest.raises(SpecError) as caught:
        plan_with(tmp_path, None, profile="cal.json")
    assert reason in caught.value.issues[0].message


def _alpha_beta_points(kind, p, alpha, beta, sizes, factors=None):
    factors = factors or [1.0] * len(sizes)
    return [
        (n, (model_terms(kind, p, n)[0] * alpha + model_terms(kind, p, n)[1] / beta) * f)
        for n, f in zip(sizes, factors)
    ]


def test_timings_that_identify_a_bandwidth_pass_the_fit_check():
    sizes = (4096, 65536, 2**20, 2**24)
    assert fit_problem("all_reduce", 2, _alpha_beta_points("all_reduce", 2, 100e-6, 1e9, sizes)) is None
    # +-20% noise, as a busy machine gives: still a fit (its relative RMS is about 0.2)
    noisy = _alpha_beta_points("all_reduce", 2, 100e-6, 1e9, sizes, [1.2, 0.8, 1.2, 0.8])
    assert fit_problem("all_reduce", 2, noisy) is None
    # pure bandwidth whose start-up cost fits below 0: clamped, and the clamped fit describes the points
    clamped = [(n, n / 1e9 * f) for n, f in ((4096, 0.5), (2**20, 1.0), (2**24, 1.0))]
    assert fit_problem("send_recv", 2, clamped) is None


def test_timings_that_do_not_grow_with_the_size_are_no_fit():
    # The audit's --quick all-reduce on 2 gloo processes: 4 KB in 2.1 ms, 12 KB in 0.35 ms, 33 KB in 3.3 ms,
    # published as 0.029 GB/s with latency 0. Its sizes span 33 / 4 = 8x, under MIN_SIZE_SPAN = 64.
    quick = [(4096, 2.1e-3), (12288, 0.35e-3), (33792, 3.3e-3)]
    assert fit_problem("all_reduce", 2, quick).startswith(
        "the sizes span less than 64x, too little to tell start-up cost from bandwidth (4.0 KiB in 2.1 ms, "
        "12.0 KiB in 350 µs, 33.0 KiB in 3.3 ms)"
    )
    # The same at 8 MiB: the largest takes 3.3 / 2.1 = 1.6x the smallest's time, under MIN_TIME_GROWTH = 2.
    wider = [(4096, 2.1e-3), (12288, 0.35e-3), (8 * 2**20, 3.3e-3)]
    assert fit_problem("all_reduce", 2, wider).startswith("the time does not grow with the message size")
    # Flat (start-up cost only, 1 ms whatever the size): least squares clamps the bandwidth to 1e15 B/s.
    flat = [(n, 1e-3) for n in (4096, 65536, 2**20)]
    assert fit_problem("all_reduce", 2, flat).startswith("the time does not grow")
    assert fit_alpha_beta("all_reduce", 2, flat)[1] == pytest.approx(1e15)


def test_timings_the_alpha_beta_form_misses_are_no_fit():
    # Growing 100x overall, but the 64 KiB point is 30x the 1 MiB one: the best fit's relative RMS is ~0.68 > 0.5
    scattered = [(4096, 1e-4), (65536, 3e-3), (2**20, 1e-4), (2**24, 1e-2)]
    assert fit_problem("all_reduce", 2, scattered).startswith("the best fit misses the timings by 68% RMS")


def test_larger_sizes_are_timed_again_up_to_a_cap():
    # 4x to 256x the largest: 128 KiB .. 8 MiB, one size every other doubling
    assert retry_sizes(32 * 1024) == (131072, 524288, 2097152, 8388608)
    assert retry_sizes(1024 * 2**20) == ()  # already beyond RETRY_LARGEST (256 MiB)


def test_a_fit_with_a_problem_is_priced_with_the_data_sheet_and_noted(tmp_path, capsys):
    fit = {"kind": "all_reduce", "group_size": 2, "medium": "intra_node", "latency": 0.0, "bandwidth": 1e15}
    problem = "the time does not grow with the message size (4 KiB in 2.1 ms, 33 KiB in 2.2 ms)"
    fits = [{**fit, "points": [[4096, 2.1e-3], [33792, 2.2e-3]], "problem": problem}]
    notes = list(fit_notes([CollectiveFit.model_validate(f) for f in fits]))
    plan = plan_with(tmp_path, profile_dict(collectives=fits, notes=notes))
    preset = plan_with(tmp_path, None)
    assert plan.hardware.intra_node_bw == preset.hardware.intra_node_bw  # the cpu data sheet's 2 GB/s
    assert plan.hardware.measured.collectives == ()
    assert plan.notes == (
        "profile cal.json: all_reduce over 2 ranks (intra_node) was not fitted: " + problem + "; its collectives are "
        "priced with the data sheet's intra_node_bw and intra_node_latency (or another kind's fit) instead. Run "
        "`planc calibrate` without --quick, or on a quieter machine, to measure it",
    )
    plan_file = tmp_path / "p.plan"
    plan_file.write_text(
        "model { layers = 2  hidden = 32  heads = 4  vocab = 96  seq_len = 16 }\n"
        'hardware { device = "cpu"  per_node = 2  profile = "cal.json" }\ntrain { global_batch = 8 }\n'
    )
    from planc.cli import main

    assert main(["explain", str(plan_file)]) == 0
    assert "all_reduce over 2 ranks (intra_node) was not fitted: the time does not grow" in capsys.readouterr().out


def test_a_profile_of_another_process_count_gets_a_note(tmp_path):
    """docs/calibrate.md: calibrate with one process per device, as the plan runs. A profile of 2 processes
    per node (profile_dict) named by a 4-process plan says so, and how to measure the plan's count."""
    assert plan_with(tmp_path, profile_dict()).notes == ()  # 2 per node, as measured: nothing to say
    four = plan_with(tmp_path, profile_dict(), per_node=4)
    assert four.notes == (
        "profile cal.json: measured with 2 process(es) per node, but the plan runs 4: its rates are those of "
        "2 process(es) sharing a node, so the predictions may be off by more than their band; calibrate as "
        "the plan runs: `planc calibrate --nproc 4 --cpu`",
    )
    two_nodes = plan_with(tmp_path, profile_dict(), nodes=2)
    assert len(two_nodes.notes) == 1
    assert "measured with 2 process(es) per node on 1 node(s), but the plan runs 2 on 2 node(s)" in two_nodes.notes[0]
    assert "as the program of a 2-node torchrun" in two_nodes.notes[0]
    assert plan_with(tmp_path, None, per_node=4).notes == ()  # no profile, no note


def test_a_measured_link_is_what_nccl_moved(tmp_path):
    """A profile's fit already is what the library moved, protocol and NVLS included: the data
    sheet's link share and the switch all-reduce give way to it, but only for the medium it
    measured, and not where the plan wrote that medium's (line) rate itself."""
    from planc.units import Quantity

    gpu = profile_dict(device_kind="cuda", device_name="NVIDIA H100 80GB HBM3", backend="nccl")
    (tmp_path / "gpu.json").write_text(json.dumps(gpu))
    raw = {
        "model": {"layers": 2, "hidden": 32, "heads": 4, "vocab": 96, "seq_len": 16},
        "hardware": {"device": "H100-SXM", "nodes": 2, "profile": "gpu.json"},
        "train": {"global_batch": 8},
    }
    hw = build_plan(raw, base_dir=tmp_path).hardware
    assert (hw.intra_node_bw, hw.intra_node_link_efficiency, hw.nvls_all_reduce_bw) == (2e9, 1.0, None)
    assert hw.inter_node_link_efficiency == 0.96  # the network was not measured
    raw["hardware"]["intra_node_bw"] = Quantity.of(450, "GB/s")
    hw = build_plan(raw, base_dir=tmp_path).hardware
    assert (hw.intra_node_link_efficiency, hw.nvls_all_reduce_bw) == (0.82, 275e9)


def test_model_ops_cost_what_was_measured_at_their_size(tmp_path):
    # Two sizes measured: 5 us per op at 512 activation elements, 7 us at 4096. Between them the
    # cost is linear (at 1024: 5 + 2 x 512 / 3584 us), beyond them flat; a block of the plan's
    # micro-batch (4 rows x seq x hidden / tp elements) takes its size's figure for every op.
    raw = profile_dict()
    points = [{"elements": 512, "seconds": 5e-6}, {"elements": 4096, "seconds": 7e-6}]
    raw["measured"] = {**raw["measured"], "op_costs": points, "bf16_host_factor": 1.5}
    plan = plan_with(tmp_path, raw)
    device = device_for(plan.hardware, "fp32")
    assert device.seconds_per_model_op(4, 4, 100) == pytest.approx(5e-6)
    assert device.seconds_per_model_op(4, 4, 1024) == pytest.approx(5e-6 + 2e-6 * 512 / 3584)
    assert device.seconds_per_model_op(4, 4, 1e6) == pytest.approx(7e-6)
    # Without per-mode figures a bf16 op costs the profile's factor more (profiles before them).
    assert device.seconds_per_model_op(2, 2, 1e6) == pytest.approx(1.5 * 7e-6)
    # The step's own ops (optimizer, clipping) keep seconds_per_op: they act on parameters.
    assert device.seconds_per_op == pytest.approx(SECONDS_PER_OP)
    free_device = host_free_device(tmp_path)
    model = plan.model
    elements = 4 * model.seq_len * model.hidden
    per_op = device.seconds_per_model_op(4, 4, elements)
    with_ops, no_ops = cpu_blocks(model, device, free_device)
    fwd_ops, bwd_ops = BLOCK_OPS[("layernorm", "gelu", "learned")]
    assert with_ops.forward - no_ops.forward == pytest.approx(fwd_ops * per_op)
    assert with_ops.backward - no_ops.backward == pytest.approx(bwd_ops * per_op)


def test_bf16_model_ops_cost_what_their_mode_measured(tmp_path):
    # Per fp32 op: bf16 parameters 9 and 11 us, autocast 10 and 14 us at 512 and 4096 elements;
    # at 2304 elements (half-way) the mean of the two; the factor is not used where they exist.
    raw = profile_dict()
    points = [
        {"elements": 512, "seconds": 5e-6, "seconds_bf16": 9e-6, "seconds_autocast": 10e-6},
        {"elements": 4096, "seconds": 7e-6, "seconds_bf16": 11e-6, "seconds_autocast": 14e-6},
    ]
    raw["measured"] = {**raw["measured"], "op_costs": points, "bf16_host_factor": 3.0, "autocast_host_factor": 3.0}
    device = device_for(plan_with(tmp_path, raw).hardware, "bf16")
    assert device.seconds_per_model_op(4, 4, 2304) == pytest.approx(6e-6)
    assert device.seconds_per_model_op(2, 2, 2304) == pytest.approx(10e-6)
    assert device.seconds_per_model_op(2, 4, 2304) == pytest.approx(12e-6)
    assert device.seconds_per_model_op(2, 4, 100) == pytest.approx(10e-6)


def test_selective_recomputation_redispatches_the_forward_only_on_a_cpu():
    # planc's op-level policy reruns every forward op through the dispatcher in backward (the
    # saved ones return their cached outputs): on a CPU the rerun costs the forward's host ops
    # (test_cost_model_uses_measured_rates). On a GPU they overlap the backward's kernels.
    import dataclasses

    from planc.cost.compute import Device
    from planc.spec.hardware_profile import MeasuredRates

    gpu = Device(peak=989e12, efficiency=0.6, hbm_bw=3.35e12, sms=132, generation="hopper")
    host_free = dataclasses.replace(gpu, measured=MeasuredRates())
    assert gpu.seconds_per_op > 0 and host_free.seconds_per_op == 0
    model = build_plan(
        {"model": {"preset": "gpt2"}, "hardware": {"device": "H100-SXM"}, "train": {"global_batch": 8}}
    ).model
    rerun = block_times(model, 4, 1, False, gpu, 2, 2, PLANC_RUNTIME).selective_recompute
    assert rerun == block_times(model, 4, 1, False, host_free, 2, 2, PLANC_RUNTIME).selective_recompute


def test_the_bytes_calibrate_prices_each_mode_with_map_back_to_the_mode():
    # calibrate takes the kernels off each mode's time at MODE_BYTES; the cost model reads a plan's
    # mode from its bytes: fp32 4/4, bf16 parameters 2/2, autocast over fp32 parameters 2/4.
    from planc.spec.hardware_profile import MODE_BYTES, op_mode

    assert MODE_BYTES == {"fp32": (4, 4), "bf16": (2, 2), "autocast": (2, 4)}
    assert all(op_mode(*MODE_BYTES[mode]) == mode for mode in MODE_BYTES)
