"""The run directory's bookkeeping, without training: what `planc run` refuses, rewinds and prints, and what
`planc doctor` reads back from a run directory written by hand (every expected line derived from it)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from planc.cli import main
from planc.commands.run_checks import discard
from planc.errors import PlanError
from planc.rundir.carry_over import compare_plans
from planc.rundir.events import record_event
from planc.rundir.metrics_file import DISCARDED_FILE, read_metrics, rewind_metrics
from planc.rundir.state import inspect_run
from planc.supervise import descendants, kill_tree

from .conftest import write_plan


def _plan(tmp_path, checkpoint="every = 2"):
    return write_plan(
        tmp_path / "p.plan", per_node=2, layout="tp = 1  pp = 1  dp = 2  zero = 0", steps=4, checkpoint=checkpoint
    )


def _metrics(run_dir, steps):
    lines = [json.dumps({"step": s, "loss": 5.0 - s, "lr": 0.01, "step_s": 0.5, "memory_bytes": 2**30}) for s in steps]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_a_rerun_never_mixes_two_runs_and_a_finished_run_is_not_relaunched(tmp_path, capsys):
    plan, out = _plan(tmp_path, checkpoint=None), tmp_path / "run"
    assert main(["run", str(plan), "--out", str(out), "--print"]) == 0
    _metrics(out, [1, 2])
    assert main(["run", str(plan), "--out", str(out), "--steps", "4"]) == 1
    err = capsys.readouterr().err
    assert "holds 2 logged step(s) of an earlier run and no checkpoint to resume from" in err and "--fresh" in err

    record_event(out, "finished", step=2)
    assert main(["run", str(plan), "--out", str(out), "--steps", "2"]) == 0
    assert "has already finished: 2 step(s) trained (asked: 2)" in capsys.readouterr().err

    assert main(["run", str(plan), "--out", str(out), "--fresh", "--print"]) == 0
    assert "would discard (not with --print) 2 logged step(s)" in capsys.readouterr().err
    assert (out / "metrics.jsonl").exists() and (out / "events.jsonl").exists()  # --print deletes nothing
    discard(inspect_run(out), json.loads((out / "plan.json").read_text())["plan"])
    assert "discarded 2 logged step(s)" in capsys.readouterr().err
    assert not (out / "metrics.jsonl").exists() and not (out / "events.jsonl").exists()


def test_a_finished_run_without_a_checkpoint_names_only_a_command_that_runs(tmp_path, capsys):
    """No checkpoint block, 2 of 2 steps trained: there is nothing to train further from, so `--steps N`
    (what planc said to a finished run) would be refused; `planc run` and `planc doctor` both name --fresh,
    and what they name goes ahead."""
    plan, out = _plan(tmp_path, checkpoint=None), tmp_path / "run"
    assert main(["run", str(plan), "--out", str(out), "--print"]) == 0
    _metrics(out, [1, 2])
    record_event(out, "launch", steps=2, layout="TP 1 × PP 1 × DP 2 · DDP", world_size=2)
    record_event(out, "finished", step=2)
    capsys.readouterr()
    assert main(["run", str(plan), "--out", str(out), "--steps", "2"]) == 0
    said = capsys.readouterr().err
    assert "has already finished: 2 step(s) trained (asked: 2)" in said and "--steps N" not in said, said
    assert "no checkpoint to train further from, so only --fresh runs it again" in said
    assert main(["doctor", str(out)]) == 0
    advice = f"It has no checkpoint to train further from: `planc run {plan} --out {out} --fresh` starts over"
    assert advice in capsys.readouterr().out
    assert main(["run", str(plan), "--out", str(out), "--steps", "3"]) == 1  # why neither names --steps N
    assert "no checkpoint to resume from" in capsys.readouterr().err
    assert main(["run", str(plan), "--out", str(out), "--fresh", "--print"]) == 0  # what both name: goes ahead


def test_doctor_on_a_failure_before_the_first_checkpoint_names_the_cause_and_a_command_that_runs(tmp_path, capsys):
    """Rank 1 SIGKILLed in step 3, no restart, no checkpoint yet (what `PLANC_FAULT=kill@rank=1,step=3` and
    --max-restarts 0 leave): rank 1 wrote no error, so torchrun's record is the only word on how it ended,
    and the plain rerun is refused (2 steps logged, nothing to resume), so the advice names --fresh."""
    plan, out = _plan(tmp_path), tmp_path / "run"
    assert main(["run", str(plan), "--out", str(out), "--print"]) == 0
    _metrics(out, [1, 2])
    record_event(out, "launch", steps=4, layout="TP 1 × PP 1 × DP 2 · DDP", world_size=2)
    record_event(out, "attempt", attempt=0, start_step=0)
    record_event(out, "worker_failed", local_rank=1, pid=42, exitcode=-9, signal="SIGKILL")
    record_event(out, "end", status="failed", exit=1, restarts=0)
    capsys.readouterr()
    assert main(["doctor", str(out)]) == 1
    report = capsys.readouterr().out
    again = f"planc run {plan} --out {out}"
    assert "the first failure, as torchrun saw it: local rank 1 (pid 42) killed by SIGKILL" in report, report
    assert f"`{again}` is refused: fix the cause, then `{again} --fresh` starts over" in report, report
    assert "then resume with" not in report


@pytest.mark.parametrize("directory", ["/tmp/elsewhere", "../ck", "a/../../ck", "./.."])
def test_a_checkpoint_dir_outside_the_run_directory_is_refused(tmp_path, capsys, directory):
    plan = _plan(tmp_path, checkpoint=f'every = 2  dir = "{directory}"')
    assert main(["check", str(plan)]) == 1
    err = capsys.readouterr().err
    assert f'checkpoint dir "{directory}" is outside the run directory' in err
    assert f"{plan}:" in err  # located at the key


@pytest.mark.parametrize("directory", ["ck", "a/../ck", "./ck/deeper", "."])
def test_a_checkpoint_dir_inside_the_run_directory_is_accepted(tmp_path, directory):
    assert main(["check", str(_plan(tmp_path, checkpoint=f'every = 2  dir = "{directory}"'))]) == 0


def test_fresh_removes_only_the_checkpoints_planc_wrote(tmp_path, capsys):
    """A run directory whose plan.json names a shared folder (written before `planc check` refused one):
    --fresh removes its step-N entries, never the folder's other files, and --print removes nothing."""
    plan, out, shared = _plan(tmp_path), tmp_path / "run", tmp_path / "scratch"
    assert main(["run", str(plan), "--out", str(out), "--print"]) == 0
    record = json.loads((out / "plan.json").read_text())
    record["plan"]["checkpoint"]["dir"] = str(shared)
    (out / "plan.json").write_text(json.dumps(record))
    shared.mkdir()
    (shared / "other_project.txt").write_text("not planc's")
    for name in ("step-00000002", "step-00000004.tmp", "step-00000001.corrupt"):
        (shared / name).mkdir()
        (shared / name / "planc.json").write_text(json.dumps({"format": 1, "step": 2}))
    _metrics(out, [1, 2, 3])
    capsys.readouterr()

    assert main(["run", str(plan), "--out", str(out), "--fresh", "--print"]) == 0
    assert "would discard (not with --print) 3 logged step(s) and 3 checkpoint(s)" in capsys.readouterr().err
    assert sorted(p.name for p in shared.iterdir()) == [
        "other_project.txt",
        "step-00000001.corrupt",
        "step-00000002",
        "step-00000004.tmp",
    ]
    assert (out / "metrics.jsonl").exists()

    discard(inspect_run(out), record["plan"])
    assert "discarded 3 logged step(s) and 3 checkpoint(s)" in capsys.readouterr().err
    assert [p.name for p in shared.iterdir()] == ["other_project.txt"]
    assert (out / "plan.json").exists() and not (out / "metrics.jsonl").exists()


def test_printed_commands_carry_restarts_and_the_stop_deadline(tmp_path, capsys):
    plan, out = _plan(tmp_path, checkpoint="every = 2  stop_deadline = 1 min"), tmp_path / "run"
    assert main(["run", str(plan), "--out", str(out), "--print"]) == 0
    # max_restarts defaults to 3; torchrun's shutdown timeout is the 60 s deadline + 5 s for the workers' own watchdog.
    assert capsys.readouterr().out.strip() == (
        f"cd {out} && TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 TORCH_ELASTIC_SHUTDOWN_TIMEOUT=65 torchrun --standalone "
        "--nproc-per-node 2 --max-restarts 3 train.py --out ."
    )
    assert main(["run", str(plan), "--out", str(out), "--print", "--max-restarts", "0"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"cd {out} && TORCH_ELASTIC_SHUTDOWN_TIMEOUT=65 torchrun --standalone --nproc-per-node 2 train.py --out ."
    )


def test_an_older_torchrun_that_kills_before_the_deadline_is_named(tmp_path, capsys, monkeypatch):
    """torch 2.11's torchrun has no shutdown timeout (seen on a GPU machine): it kills 30 s after a stop
    signal, so a 60 s deadline gets a warning; torch 2.13's honours the deadline and gets none."""
    import dataclasses

    import torch.distributed.launcher.api as launcher_api

    from planc.dsl.load import load_plan
    from planc.launch import _warn_if_torchrun_kills_sooner
    from planc.strategies.registry import load_registry

    plan = load_plan(_plan(tmp_path, checkpoint="every = 2  stop_deadline = 1 min"), strategies=load_registry())
    _warn_if_torchrun_kills_sooner(plan)
    assert "kills the workers" not in capsys.readouterr().err

    @dataclasses.dataclass
    class LaunchConfigOf211:  # the fields that matter: no shutdown_timeout
        min_nodes: int = 1

    monkeypatch.setattr(launcher_api, "LaunchConfig", LaunchConfigOf211)
    _warn_if_torchrun_kills_sooner(plan)
    assert (
        "kills the workers 30 s after a stop signal, before the plan's stop deadline of 60 s" in capsys.readouterr().err
    )


def test_rewinding_moves_later_steps_aside_and_drops_a_torn_line(tmp_path):
    _metrics(tmp_path, [1, 2, 3, 4])
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "lo')  # a crash in the middle of a write
    assert rewind_metrics(tmp_path, 2) == 2
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    moved = read_metrics(tmp_path, DISCARDED_FILE)
    assert [(r["step"], r["resumed_from_step"]) for r in moved] == [(3, 2), (4, 2)]
    assert (tmp_path / "metrics.jsonl").read_text().endswith("\n")


def test_only_the_model_and_the_optimizer_must_match_to_carry_over():
    saved = {"model": {"name": "a", "hidden": 32, "layers": 2}, "train": {"optimizer": "adamw", "lr": 0.01}}
    same = {"model": {"name": "b", "hidden": 32, "layers": 2}, "train": {"optimizer": "adamw", "lr": 0.003}}
    assert compare_plans(saved, same) == ([], ["train.lr: 0.01 → 0.003"])
    other = {"model": {"hidden": 64, "layers": 2}, "train": {"optimizer": "sgd", "lr": 0.01}}
    refusals, _ = compare_plans(saved, other)
    assert refusals[0] == "model.hidden is 32 in the checkpoint, 64 here"
    assert refusals[1].startswith("train.optimizer is 'adamw' in the checkpoint, 'sgd' here")


def test_doctor_tells_the_story_of_a_failed_night(tmp_path, capsys):
    plan, out = _plan(tmp_path), tmp_path / "run"
    assert main(["run", str(plan), "--out", str(out), "--print"]) == 0
    capsys.readouterr()
    _metrics(out, [1, 2, 3, 4, 5])
    (out / "checkpoints" / "step-00000004").mkdir(parents=True)
    (out / "checkpoints" / "step-00000004" / "planc.json").write_text(json.dumps({"format": 1, "step": 4}))
    (out / "checkpoints" / "step-00000006.tmp").mkdir()
    now = time.time() - 3600
    events = [
        ("launch", {"steps": 8, "layout": "TP 1 × PP 1 × DP 2 · DDP", "world_size": 2}),
        ("attempt", {"attempt": 0, "start_step": 0}),
        ("worker_failed", {"local_rank": 1, "pid": 42, "exitcode": -9, "signal": "SIGKILL"}),
        ("attempt", {"attempt": 1, "start_step": 2, "causes": ["rank 1 stopped without a word in step 3"]}),
        ("checkpoint_failed", {"step": 6, "errors": {"1": "[Errno 28] No space left on device"}, "previous": 4}),
        (
            "hang",
            {
                "step": 6,
                "collective": {"name": "all_reduce", "seq": 9, "group": "mesh_dp"},
                "missing": [1],
                "waiting": [0],
            },
        ),
    ]
    for offset, (name, fields) in enumerate(events):
        line = json.dumps(
            {"time": now + offset, "event": name, **fields, **({"waiting": [0]} if name == "hang" else {})}
        )
        with open(out / "events.jsonl", "a") as f:
            f.write(line + "\n")
    assert main(["doctor", str(out)]) == 1
    report = capsys.readouterr().out
    for expected in (
        "failed: 5 step(s) logged",
        "5 of 8 step(s) logged in metrics.jsonl",
        "newest complete checkpoint: step-00000004 (step 4); resuming repeats 1 step(s)",
        "step-00000006.tmp: partial (a save was interrupted)",
        "save of step 6 failed: rank 1: [Errno 28] No space left on device",
        "restart 1 at ",
        "from step 2: rank 1 stopped without a word in step 3 [observed: local rank 1 (pid 42) killed by SIGKILL]",
        "step 6: all_reduce #9 (mesh_dp) timed out",
        "did not arrive: rank(s) 1; waiting: rank(s) 0",
        f"fix the cause, then `planc run {plan} --out {out}` resumes from the newest complete checkpoint (step 4)",
        "1 restart(s) did not get past the failure",
    ):
        assert expected in report, f"{expected!r} not in:\n{report}"
    assert main(["doctor", str(tmp_path)]) == 1
    assert "does not look like a run directory" in capsys.readouterr().err


@pytest.mark.dist
def test_the_whole_process_tree_is_found_and_killed():
    shell = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"])
    try:
        deadline = time.time() + 10
        while len(descendants(shell.pid)) < 2 and time.time() < deadline:
            time.sleep(0.05)
        below = descendants(shell.pid)
        assert len(below) == 2
        kill_tree(shell.pid)
        assert shell.wait(timeout=10) == -9
        time.sleep(0.2)
        for pid in below:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[-1].split()[0] if _alive(pid) else "gone"
            assert state in ("Z", "gone")
    finally:
        if shell.poll() is None:
            shell.kill()


def _alive(pid: int) -> bool:
    try:
        open(f"/proc/{pid}/stat").close()
        return True
    except OSError:
        return False


def test_a_run_whose_last_save_failed_is_not_finished(tmp_path, capsys):
    """Every step trained, but the checkpoint of the last one hit a full disk: the newest checkpoint is step 2
    of 4. That is a failure (exit 1), doctor says so, and running again retrains steps 3-4 from step 2."""
    from types import SimpleNamespace

    from planc.commands.run import _report
    from planc.commands.run_checks import check_existing_run
    from planc.dsl.load import load_plan
    from planc.strategies.registry import load_registry

    plan, out = _plan(tmp_path), tmp_path / "run"
    assert main(["run", str(plan), "--out", str(out), "--print"]) == 0
    _metrics(out, [1, 2, 3, 4])
    (out / "checkpoints" / "step-00000002").mkdir(parents=True)
    (out / "checkpoints" / "step-00000002" / "planc.json").write_text(json.dumps({"format": 1, "step": 2}))
    record_event(out, "launch", steps=4, layout="TP 1 × PP 1 × DP 2 · DDP", world_size=2)
    record_event(out, "attempt", attempt=0, start_step=0)
    record_event(out, "checkpoint_failed", step=4, errors={"0": "[Errno 28] No space left on device"}, previous=2)
    record_event(out, "finished", step=4, checkpoint=None)
    capsys.readouterr()

    args = SimpleNamespace(file=str(plan))
    compiled = SimpleNamespace(plan=load_plan(plan, strategies=load_registry()))
    with pytest.raises(PlanError) as failed:
        _report(args, compiled, out, SimpleNamespace(stop_signal=None, status=0))
    assert failed.value.message == (
        "trained to step 4, but the checkpoint of step 4 could not be saved (the reason is above); the weights of "
        "steps 3-4 are not saved anywhere: the newest complete checkpoint is step-00000002"
    )
    assert failed.value.hint.endswith(
        f"`planc run {plan} --out {out}` resumes from step 2 and trains the remaining steps again"
    )

    state = inspect_run(out)
    assert state.finished_at(4) is None
    saved = json.loads((out / "plan.json").read_text())["plan"]
    assert check_existing_run(state, saved, target=4, plan_file=str(plan), fresh=False) is None  # launches again

    assert main(["doctor", str(out)]) == 1
    report = capsys.readouterr().out
    assert (
        "failed: all 4 step(s) trained, but the checkpoint of step 4 could not be saved; "
        "the newest complete checkpoint is step 2"
    ) in report
    assert (
        f"fix the cause, then `planc run {plan} --out {out}` resumes from the newest complete checkpoint (step 2)"
        in report
    )

    (out / "checkpoints" / "step-00000004").mkdir()  # once the step-4 checkpoint exists, the run is finished
    (out / "checkpoints" / "step-00000004" / "planc.json").write_text(json.dumps({"format": 1, "step": 4}))
    assert inspect_run(out).finished_at(4) == 4


def _failed_report(plan, out):
    """planc run's report of a training that failed (torchrun exited 1) after the steps in metrics.jsonl."""
    from types import SimpleNamespace

    from planc.commands.run import _report
    from planc.dsl.load import load_plan
    from planc.strategies.registry import load_registry

    record_event(out, "launch", steps=4, layout="TP 1 × PP 1 × DP 2 · DDP", world_size=2)
    record_event(out, "attempt", attempt=0, start_step=0)
    args = SimpleNamespace(file=str(plan), steps=None)
    compiled = SimpleNamespace(plan=load_plan(plan, strategies=load_registry()))
    with pytest.raises(PlanError) as failed:
        _report(args, compiled, out, SimpleNamespace(stop_signal=None, status=1))
    return failed.value


def test_a_failure_before_the_first_checkpoint_hints_at_fresh_since_a_plain_rerun_is_refused(tmp_path, capsys):
    """2 steps logged and the step-2 checkpoint never saved (the failure came first): the command the hint gives
    must be one that runs, and the plain rerun is refused (it would log a second step 1)."""
    plan, out = _plan(tmp_path), tmp_path / "run"
    assert main(["run", str(plan), "--out", str(out), "--print"]) == 0
    _metrics(out, [1, 2])
    hint = _failed_report(plan, out).hint
    again = f"planc run {plan} --out {out}"
    assert "resumes" not in hint
    assert hint.endswith(
        f"no checkpoint was saved before the failure, so `{again}` is refused: fix the cause, "
        f"then `{again} --fresh` starts over"
    )
    capsys.readouterr()
    assert main(["run", str(plan), "--out", str(out)]) == 1  # what the hint says: refused ...
    assert "no checkpoint to resume from" in capsys.readouterr().err
    assert main(["run", str(plan), "--out", str(out), "--fresh", "--print"]) == 0  # ... and --fresh goes ahead


def test_a_failure_after_a_checkpoint_hints_at_the_step_it_resumes_from(tmp_path):
    plan, out = _plan(tmp_path), tmp_path / "run"
    assert main(["run", str(plan), "--out", str(out), "--print"]) == 0
    _metrics(out, [1, 2, 3])
    (out / "checkpoints" / "step-00000002").mkdir(parents=True)
    (out / "checkpoints" / "step-00000002" / "planc.json").write_text(json.dumps({"format": 1, "step": 2}))
    assert _failed_report(plan, out).hint.endswith(
        f"then `planc run {plan} --out {out}` resumes from the newest complete checkpoint (step 2)"
    )


def test_a_failure_before_any_step_and_checkpoint_starts_over(tmp_path):
    plan, out = _plan(tmp_path), tmp_path / "run"
    assert main(["run", str(plan), "--out", str(out), "--print"]) == 0
    assert _failed_report(plan, out).hint.endswith(
        f"then `planc run {plan} --out {out}` starts over (no checkpoint was saved before the failure)"
    )


GPU_PLAN = """model "tiny" {
  layers = 2
  hidden = 64
  heads = 4
  vocab = 128
  seq_len = 32
}
hardware {
  device = "H100-SXM"
  nodes = 2
  per_node = 8
}
train {
  global_batch = 64
  steps = 10
}
layout { tp = 1  pp = 1  dp = 16  zero = 0  recompute = none }
"""
NCCL_DUMP_ENV = "TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_FR_DUMP_TEMP_FILE=flight_recorder/rank-"


def test_gpu_launches_dump_the_flight_record_on_a_timeout_on_every_node(tmp_path, capsys):
    # every node's command and the Slurm script carry NCCL's dump-on-timeout settings (relative to the
    # run directory, where torchrun runs), so the launcher can name the absent rank after a SIGABRT
    plan, out = tmp_path / "gpu.plan", tmp_path / "run"
    plan.write_text(GPU_PLAN)
    assert main(["run", str(plan), "--out", str(out), "--print"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if "torchrun" in line]
    assert len(commands) == 2 and all(f"&& {NCCL_DUMP_ENV} torchrun --nnodes 2" in c for c in commands), commands
    assert main(["run", str(plan), "--out", str(out), "--slurm"]) == 0
    script = (out / "launch.slurm").read_text()
    assert "export TORCH_NCCL_DUMP_ON_TIMEOUT=1\nexport TORCH_FR_DUMP_TEMP_FILE=flight_recorder/rank-\n" in script
    cpu = write_plan(tmp_path / "cpu.plan", per_node=2, layout="tp = 1  pp = 1  dp = 2  zero = 0", steps=4)
    capsys.readouterr()
    assert main(["run", str(cpu), "--out", str(tmp_path / "cpu"), "--print"]) == 0
    assert "TORCH_NCCL" not in capsys.readouterr().out  # gloo has no watchdog to dump


def test_doctor_names_the_plan_as_a_path_from_where_it_runs(tmp_path, capsys, monkeypatch):
    """The run was started from its project folder with a relative plan path; doctor runs later from
    elsewhere. The command it suggests must name the plan as seen from there: a path below the
    doctor's directory relative to it, any other absolute."""
    project = tmp_path / "project"
    project.mkdir()
    _plan(project)
    monkeypatch.chdir(project)
    assert main(["run", "p.plan", "--out", "run", "--print"]) == 0
    _metrics(project / "run", [1, 2])
    record_event(project / "run", "launch", steps=4, layout="TP 1 × PP 1 × DP 2 · DDP", world_size=2)
    capsys.readouterr()
    for cwd, plan_shown, run_shown in (
        (tmp_path, "project/p.plan", "project/run"),  # below: relative, as typed here
        (tmp_path / "elsewhere", str(project / "p.plan"), str(project / "run")),  # not below: absolute
    ):
        cwd.mkdir(exist_ok=True)
        monkeypatch.chdir(cwd)
        main(["doctor", run_shown])
        report = capsys.readouterr().out
        assert f"planc run {plan_shown} --out {run_shown}" in report, report
        assert (cwd / plan_shown).is_file()


def test_doctor_counts_the_steps_a_run_started_in_place_trained_toward(tmp_path, capsys):
    """``torchrun ... -m planc run FILE --steps 2`` writes no launch event: the target is its
    attempt's, 2, not the plan's 4 ("finished" beside "2 of 4 step(s) logged" before)."""
    plan, out = _plan(tmp_path, checkpoint=None), tmp_path / "run"
    assert main(["run", str(plan), "--out", str(out), "--print"]) == 0
    capsys.readouterr()
    _metrics(out, [1, 2])
    for name, fields in [("attempt", {"attempt": 0, "start_step": 0, "target_step": 2}), ("finished", {"step": 2})]:
        record_event(out, name, **fields)
    main(["doctor", str(out)])
    report = capsys.readouterr().out
    assert "finished: all 2 step(s) trained" in report, report
    assert "2 of 2 step(s) logged in metrics.jsonl" in report, report
