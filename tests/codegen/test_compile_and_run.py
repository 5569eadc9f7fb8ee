"""`planc compile` and `planc run` end to end: the emitted program under torchrun, without the
CLI, reproduces the single-process reference; `planc run` trains, logs, and stops cleanly."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from planc.cli import main
from planc.runtime.reference import train_reference

from .conftest import plan_at

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


def _env():
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_compile_writes_a_program(tmp_path, in_root, capsys):
    out = tmp_path / "train.py"
    assert main(["compile", "plans/cpu-3d.plan", "-o", str(out)]) == 0
    compile(out.read_text(), str(out), "exec")  # valid Python
    assert "torchrun --standalone --nproc-per-node 8 train.py" in out.read_text()


def test_compile_refuses_a_layout_that_does_not_fit(tmp_path, capsys):
    plan = tmp_path / "big.plan"
    plan.write_text(
        'model { preset = "llama3-8b" }\nhardware { device = "cpu"  per_node = 1 }\ntrain { global_batch = 1 }\n'
    )
    assert main(["compile", str(plan)]) == 1
    err = capsys.readouterr().err
    # 4 GiB less the default 5% headroom = 3.8 GiB
    assert "per device, but cpu has 3.8 GiB" in err and "--force" in err
    assert main(["compile", str(plan), "--force", "-o", str(tmp_path / "t.py")]) == 0


@pytest.mark.dist
def test_emitted_program_matches_reference_under_torchrun(tmp_path, in_root):
    """pp 2 x tp 2 (SP, selective recompute, GQA, SwiGLU, RoPE, accumulation) on 4 processes."""
    plan_path = "tests/codegen/data/pp2-tp2.plan"
    assert main(["compile", plan_path, "-o", str(tmp_path / "train.py")]) == 0
    result = subprocess.run(
        [*TORCHRUN, "--nproc-per-node", "4", "train.py", "--out", "."],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    losses = [r["loss"] for r in _metrics(tmp_path)]
    reference = train_reference(plan_at(plan_path), steps=3).losses
    assert len(losses) == 3
    assert max(abs(a - b) for a, b in zip(losses, reference)) < 1e-5


@pytest.mark.dist
def test_planc_run_trains_and_writes_the_run_directory(tmp_path, in_root):
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "planc", "run", "plans/tiny-cpu.plan", "--steps", "3", "--out", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = _metrics(out)
    assert [r["step"] for r in records] == [1, 2, 3]
    for key in ("step", "loss", "lr", "step_s", "tokens_per_s"):
        assert all(key in r for r in records)
    record = json.loads((out / "plan.json").read_text())
    assert record["layout"]["dp"] == 4 and record["strategies"] == ["ddp"]
    reference = train_reference(plan_at("plans/tiny-cpu.plan"), steps=3).losses
    assert max(abs(r["loss"] - ref) for r, ref in zip(records, reference)) < 1e-5
    assert "loss" in result.stderr and "done" in result.stderr


@pytest.mark.dist
def test_ctrl_c_stops_every_rank(tmp_path, in_root):
    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "planc", "run", "plans/tiny-cpu.plan", "--steps", "10000", "--out", str(out)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    metrics = out / "metrics.jsonl"
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.5)
    assert metrics.exists(), "training never started"
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr
    assert "Traceback" not in stderr and "SignalException" not in stderr, stderr[-3000:]
    records = _metrics(out)  # every line whole: nothing torn
    assert 2 <= len(records) < 10000
    assert _processes_in(out) == [], "ranks still running after Ctrl-C"


def _processes_in(directory: Path) -> list[int]:
    """PIDs whose working directory is ``directory`` (torchrun and its ranks run in the run dir)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if Path(os.readlink(proc / "cwd")) == directory.resolve():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_multi_node_plan_prints_commands_and_slurm_script(tmp_path, in_root, capsys):
    out = tmp_path / "run"
    assert main(["run", "plans/llama3-70b-64xh100.plan", "--out", str(out), "--steps", "5"]) == 0
    printed = capsys.readouterr().out.splitlines()
    commands = [line for line in printed if "torchrun" in line]
    assert len(commands) == 8  # one per node
    assert all("--nnodes 8 --nproc-per-node 8" in c for c in commands)
    assert [c.split("--node-rank ")[1].split()[0] for c in commands] == [str(i) for i in range(8)]
    # One rendezvous id for the run on every node, not torchrun's default "none" that every job shares.
    ids = {c.split("--rdzv-id ")[1].split()[0] for c in commands}
    assert len(ids) == 1 and ids != {"none"}
    other = tmp_path / "elsewhere" / "run"  # a folder of the same name is another run
    assert main(["run", "plans/llama3-70b-64xh100.plan", "--out", str(other), "--print"]) == 0
    other_ids = {
        line.split("--rdzv-id ")[1].split()[0] for line in capsys.readouterr().out.splitlines() if "torchrun" in line
    }
    assert len(other_ids) == 1 and other_ids != ids
    assert (out / "train.py").exists() and (out / "plan.json").exists()
    assert main(["run", "plans/llama3-70b-64xh100.plan", "--out", str(out), "--slurm"]) == 0
    script = (out / "launch.slurm").read_text()
    assert "#SBATCH --nodes=8" in script and "#SBATCH --gpus-per-node=8" in script
    assert "python -m planc.runtime.torchrun \\\n    --nnodes 8 --nproc-per-node 8" in script


def test_print_shows_the_local_command(tmp_path, in_root, capsys):
    out = tmp_path / "run"
    assert main(["run", "plans/tiny-cpu.plan", "--out", str(out), "--print", "--steps", "2"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == f"cd {out} && torchrun --standalone --nproc-per-node 4 train.py --out . --steps 2"
    assert not (out / "metrics.jsonl").exists()  # nothing ran


@pytest.mark.dist
def test_planc_run_under_torchrun_trains_in_place(tmp_path, in_root):
    """Started by torchrun itself, `planc run` builds the job in each rank instead of launching."""
    out = tmp_path / "run"
    result = subprocess.run(
        [
            *TORCHRUN,
            "--nproc-per-node",
            "2",
            "-m",
            "planc",
            "run",
            "tests/codegen/data/powersgd.plan",
            "--steps",
            "2",
            "--out",
            str(out),
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if "unknown strategy plugin 'powersgd'" in result.stderr:
        pytest.skip("planc-powersgd is not installed")
    assert result.returncode == 0, result.stderr[-3000:]
    assert [r["step"] for r in _metrics(out)] == [1, 2]
    assert (out / "plan.json").exists() and (out / "train.py").exists()


@pytest.mark.dist
def test_a_killed_rank_ends_with_clear_messages(tmp_path, in_root):
    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "planc", "run", "plans/tiny-cpu.plan", "--steps", "10000", "--out", str(out)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    metrics = out / "metrics.jsonl"
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.5)
    ranks = [pid for pid in _processes_in(out) if b"torchrun" not in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(ranks) == 4, ranks
    os.kill(max(ranks), signal.SIGKILL)  # the last-started rank
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 1
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "was killed by SIGKILL (the first failure)" in stderr, stderr[-3000:]
    assert "lost contact with another rank" in stderr
    assert "error: training failed" in stderr and "checkpoint" in stderr
    assert _processes_in(out) == []
