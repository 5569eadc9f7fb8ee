"""`planc calibrate` end to end: two gloo processes measure a tiny plan's shapes, and the plan uses the profile."""

from __future__ import annotations

import subprocess
import sys

import pytest

from planc.cost.compute import block_gemms
from planc.spec.hardware_profile import load_profile

PLAN = """
model "tiny" {
  layers = 2
  hidden = 32
  heads = 4
  vocab = 96
  seq_len = 16
}
hardware {
  device = "cpu"
  per_node = 2
  PROFILE
}
train {
  global_batch = 8
  micro_batch = 4
}
layout {
  tp = 1
}
"""


#: The collectives a calibration measures over each medium.
COLLECTIVES = {"all_reduce", "all_gather", "reduce_scatter", "send_recv", "broadcast"}


@pytest.mark.dist
def test_calibrate_writes_a_profile_the_plan_uses(tmp_path, capsys):
    (tmp_path / "tiny.plan").write_text(PLAN.replace("PROFILE", ""))
    command = [sys.executable, "-m", "planc", "calibrate", "--quick", "--cpu", "--nproc", "2"]
    command += ["--plan", "tiny.plan", "--out", "cal.json"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert 'use it: hardware { profile = "cal.json" } in tiny.plan' in done.stdout
    profile = load_profile(tmp_path / "cal.json")
    assert profile.world_size == 2 and profile.backend == "gloo" and profile.device_kind == "cpu"
    # The plan's own GEMMs at TP 1 and micro-batch 4 (64 tokens), and its head (64 x 32 x padded vocabulary).
    from planc.spec import build_plan

    model = build_plan(
        {
            "model": {"layers": 2, "hidden": 32, "heads": 4, "vocab": 96, "seq_len": 16},
            "hardware": {"device": "cpu", "per_node": 2},
            "train": {"global_batch": 8},
        }
    ).model
    expected = set(block_gemms(model, 64, 1)) | {(64, 32, model.padded_vocab)}
    assert {(g.m, g.k, g.n) for g in profile.measured.gemm} == expected
    assert {c.kind for c in profile.collectives} == COLLECTIVES
    assert all(c.group_size == 2 and c.medium == "intra_node" and c.bandwidth > 0 for c in profile.collectives)
    assert profile.measured.seconds_per_op > 0 and profile.measured.memory_bandwidth > 0
    # planc's models' ops beyond their priced kernels, at 1 and 8 rows of 16 tokens x hidden 32;
    # seconds_per_op (the step's own ops) is the smaller size's.
    op_costs = profile.measured.op_costs
    assert [p.elements for p in op_costs] == [512, 4096]
    assert all(p.seconds > 0 and p.seconds_bf16 > 0 and p.seconds_autocast > 0 for p in op_costs)
    assert profile.measured.seconds_per_op == op_costs[0].seconds
    # The factors are what the bf16 modes cost over fp32 at the larger size.
    assert profile.measured.autocast_host_factor == op_costs[1].seconds_autocast / op_costs[1].seconds
    # Two processes: the wrappers were measured; FSDP2's hooks and DTensor's dispatch cost host
    # time beyond the plain step and their collectives on any machine.
    assert profile.measured.wrappers.fsdp_per_unit > 0 and profile.measured.wrappers.tp_per_block > 0
    # The split backward walks the graph once per parameter group: dearer than one backward.
    assert profile.measured.wrappers.split_backward_per_block > 0
    # A CPU's foreach norm and rescale and its fused AdamW loop over the tensors: 48 more cost more.
    assert profile.measured.wrappers.clip_per_tensor > 0 and profile.measured.wrappers.optimizer_per_tensor > 0
    # AdamW on DTensor parameters sends each of its ops through DTensor's Python dispatch: dearer
    # than on plain tensors by far more than a quiet machine's noise (~130 us per tensor here).
    assert profile.measured.wrappers.dtensor_optimizer_per_tensor > 10e-6
    # Checkpointing's own work (one process, beyond the rerun forward): the selective policy's
    # dispatch mode asks about every op, ~1-2 ms per block here against a 0.9 ms block step, which
    # no load hides. (That it also costs more than full recomputation's wrapper, ~0.8 ms, holds on a
    # quiet machine but not beside the other xdist worker: a CI run measured 9.4 ms for full.)
    w = profile.measured.wrappers
    assert w.selective_per_block > 0 and w.checkpoint_per_block >= 0
    assert w.selective_per_block_autocast > 0 and w.checkpoint_per_block_autocast >= 0

    (tmp_path / "tiny.plan").write_text(PLAN.replace("PROFILE", 'profile = "cal.json"'))
    from planc.cli import main

    assert main(["explain", str(tmp_path / "tiny.plan")]) == 0
    assert "profile   cal.json: measured rates" in capsys.readouterr().out


def test_nproc_zero_is_refused_not_read_as_the_default(tmp_path, capsys, monkeypatch):
    """Review (fix-rev): `--nproc 0` went through `args.nproc or default` as unset and launched a
    whole calibration on 2 processes instead of saying the count is wrong."""
    from planc.cli import main
    from planc.commands import calibrate

    monkeypatch.setattr(calibrate.subprocess, "run", lambda *a, **k: pytest.fail("nothing may be launched"))
    out = tmp_path / "cpu.json"
    assert main(["calibrate", "--nproc", "0", "--cpu", "--quick", "--out", str(out)]) == 1
    assert "--nproc must be at least 1, got 0" in capsys.readouterr().err
    assert not out.exists()


def test_a_plan_on_another_kind_of_device_is_refused_before_measuring(tmp_path, capsys, monkeypatch):
    """Review (fix-rev): `planc calibrate --plan plans/llama3-8b-8xh100.plan` on a CPU machine measured
    the 8B plan's GEMMs on CPU processes, and the plan then refused the profile at hardware.profile
    ("measured on cpu, but the plan's device is 'H100-SXM'")."""
    from pathlib import Path

    from planc.cli import main
    from planc.commands import calibrate

    plans = Path(__file__).resolve().parents[2] / "plans"
    monkeypatch.setattr(calibrate.subprocess, "run", lambda *a, **k: pytest.fail("nothing may be launched"))
    out = tmp_path / "p.json"
    gpu_plan = str(plans / "llama3-8b-8xh100.plan")
    assert main(["calibrate", "--plan", gpu_plan, "--cpu", "--quick", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"--plan {gpu_plan} runs on H100-SXM, but this calibration measures CPU processes (--cpu)" in err
    # A CPU plan on a machine with GPUs, without --cpu: the GPUs would be measured.
    monkeypatch.setattr(calibrate, "_gpu_count", lambda: 8)
    assert main(["calibrate", "--plan", str(plans / "tiny-cpu.plan"), "--quick", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "runs on CPU processes, but this calibration measures the GPUs here" in err and "add --cpu" in err
    assert not out.exists()


def test_the_use_it_line_names_the_profile_as_the_plan_would_find_it(tmp_path, monkeypatch):
    """hardware.profile resolves against the .plan file's folder: with --plan the line gives that
    relative path; without, the absolute one (the bare file name it printed before found the profile
    only from a plan beside it)."""
    from planc.commands.calibrate import use_it_line

    monkeypatch.chdir(tmp_path)
    (tmp_path / "plans").mkdir()
    out = tmp_path / "profiles" / "h100.json"
    line = use_it_line(out, "plans/run.plan")
    assert line == 'use it: hardware { profile = "../profiles/h100.json" } in plans/run.plan'
    assert use_it_line(out, None).startswith(f'use it: hardware {{ profile = "{out}" }}')


@pytest.mark.dist
def test_calibrate_as_a_two_node_torchrun_measures_across_the_nodes(tmp_path):
    """docs/calibrate.md, "Across nodes": `planc calibrate` as the program of a multi-node torchrun
    measures in place, over the ranks with the same local rank on every node. Two torchrun agents
    on this machine stand for two nodes of one process each (c10d rendezvous, as on a cluster):
    every collective is measured as inter-node, and a 2-node plan prices its network with it."""
    import socket

    from planc.spec import build_plan

    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1"]
    command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}"]
    command += ["-m", "planc", "calibrate", "--cpu", "--quick", "--out", "cluster.json"]
    nodes = [subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    nodes.append(subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(out[-2000:] for out in outputs)
    profile = load_profile(tmp_path / "cluster.json")
    assert (profile.world_size, profile.nodes, profile.per_node) == (2, 2, 1)
    assert {(c.medium, c.group_size) for c in profile.collectives} == {("inter_node", 2)}
    assert {c.kind for c in profile.collectives} == COLLECTIVES
    raw = {
        "model": {"layers": 2, "hidden": 32, "heads": 4, "vocab": 96, "seq_len": 16},
        "hardware": {"device": "cpu", "nodes": 2, "per_node": 1, "profile": "cluster.json"},
        "train": {"global_batch": 8},
    }
    hardware = build_plan(raw, base_dir=tmp_path).hardware
    (fit,) = [c for c in profile.collectives if c.kind == "all_reduce"]
    if fit.problem is None:  # a fit the timings identify prices the network, taken whole
        assert (hardware.inter_node_bw, hardware.inter_node_latency) == (fit.bandwidth, fit.latency)
        assert hardware.inter_node_link_efficiency == 1.0
