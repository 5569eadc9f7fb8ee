"""``planc run FILE``: compile into a run directory and launch torchrun (or run in place under it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

HELP = "compile a plan into a run directory and train it under torchrun"
DESCRIPTION = (
    "Compile the plan into a run directory (plan.json, train.py, metrics.jsonl, checkpoints/) and "
    "launch it with torchrun on this machine. A multi-node plan prints the torchrun command for "
    "each node instead (--slurm writes an sbatch script). Under torchrun already, it trains in place. "
    "Running again with the same --out resumes from the newest checkpoint; torchrun restarts the "
    "processes after a failure; SIGTERM or Ctrl-C saves a checkpoint and stops. See docs/reliability.md."
)


def add_arguments(parser) -> None:
    from planc.commands import tolerance

    parser.add_argument("file", help="the .plan file")
    parser.add_argument("--out", help="run directory (default: runs/<plan>-<timestamp>)")
    parser.add_argument("--steps", type=int, help="optimizer steps to train (default: the plan's train.steps)")
    parser.add_argument(
        "--log",
        action="append",
        default=[],
        metavar="SINK",
        help="also log metrics to SINK: tensorboard, wandb or a sink plugin (repeatable; adds to train.log)",
    )
    parser.add_argument("--tolerance", type=tolerance, default=None, help="planner tolerance (default: the plan's)")
    parser.add_argument("--force", action="store_true", help="run even when the layout is predicted not to fit")
    parser.add_argument("--slurm", action="store_true", help="write launch.slurm into the run directory and stop")
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        help="restarts after a failed or hung process (default: the plan's checkpoint.max_restarts, 0 without one)",
    )
    parser.add_argument(
        "--resume-from",
        metavar="RUN",
        help="start from another run's newest checkpoint (or a step-N directory), at this plan's layout",
    )
    parser.add_argument(
        "--fresh", action="store_true", help="discard the run directory's metrics and checkpoints and start over"
    )
    parser.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="write the run directory and print the launch command(s) without running",
    )


def run(args) -> int:
    from planc import launch
    from planc.codegen import compile_plan
    from planc.commands.runtime import require_torch
    from planc.dsl.load import load_plan
    from planc.errors import PlanError
    from planc.strategies.registry import load_registry

    if args.steps is not None and args.steps < 1:
        raise PlanError(f"--steps must be at least 1, got {args.steps}")
    if args.max_restarts is not None and args.max_restarts < 0:
        raise PlanError(f"--max-restarts must be 0 or more, got {args.max_restarts}")
    plan_path = Path(args.file)
    registry = load_registry()
    plan = _with_steps_and_sinks(load_plan(plan_path, strategies=registry), args.steps, args.log)
    compiled = compile_plan(plan, registry, tolerance=args.tolerance, force=args.force)
    if launch.under_torchrun():
        return _run_in_place(compiled, registry, Path(args.out or "."), args.steps)

    run_dir = Path(args.out) if args.out else launch.default_run_dir(plan_path)
    finished = _prepare_run_dir(args, compiled, run_dir)
    if finished is not None:
        print(f"planc: {finished}", file=sys.stderr)
        return 0
    carry_over = None
    if args.resume_from:
        from planc.commands.run_checks import resume_from

        carry_over = resume_from(Path(args.resume_from), run_dir, plan_json(compiled), **_target(args, compiled))
    launch.write_run_dir(run_dir, compiled)
    if carry_over is not None:
        carry_over(run_dir)
    max_restarts = launch.max_restarts_of(plan, args.max_restarts)
    for warning in compiled.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    hw = plan.hardware
    _print_start(compiled, registry, run_dir)

    if args.slurm or hw.nodes > 1 or args.print_only:
        return _print_launch(args, compiled, run_dir, max_restarts)
    require_torch("planc run", *(["safetensors"] if plan.model.init == "pretrained" else []))
    launch.check_local_devices(compiled)
    from planc.rundir.events import record_event

    record_event(
        run_dir,
        "launch",
        world_size=hw.world_size,
        layout=compiled.layout.describe(),
        steps=_target(args, compiled)["target"],
        max_restarts=max_restarts,
    )
    outcome = launch.launch_local(compiled, run_dir, steps=args.steps, max_restarts=max_restarts)
    return _report(args, compiled, run_dir, outcome)


def _print_start(compiled, registry, run_dir: Path) -> None:
    """The layout line, then the third-party plugins taking part as explain names them (an
    installed plugin may join a plan that does not name it)."""
    from planc.commands.explain import plugins_taking_part

    plan = compiled.plan
    print(
        f"planc: {plan.model.name or 'model'} · {compiled.layout.describe()} · "
        f"{plan.hardware.world_size} process(es) · run directory {run_dir}",
        file=sys.stderr,
    )
    plugins = plugins_taking_part(plan, compiled.layout, registry)
    if plugins:
        print(f"planc: plugins {plugins}", file=sys.stderr)


def _print_launch(args, compiled, run_dir: Path, max_restarts: int) -> int:
    """--slurm writes an sbatch script; a multi-node plan or --print prints the command(s) instead of running."""
    from planc import launch

    hw = compiled.plan.hardware
    if args.slurm:
        script = run_dir / "launch.slurm"
        launch.write_text_atomically(
            script, launch.slurm_script(compiled, run_dir, steps=args.steps, max_restarts=max_restarts)
        )
        print(f"wrote {script}; submit it with: sbatch {script}")
        return 0
    commands = (
        launch.multi_node_commands(compiled, run_dir, steps=args.steps, max_restarts=max_restarts)
        if hw.nodes > 1
        else [launch.local_command(compiled, run_dir, steps=args.steps, max_restarts=max_restarts)]
    )
    if hw.nodes > 1:
        print(
            f"This plan spans {hw.nodes} nodes. Copy {run_dir} to every node (or use a shared "
            f"filesystem), set MASTER_ADDR to node 0's address, and run on node i the i-th line:"
        )
        if compiled.plan.data_root is not None:
            print(
                f"Relative data and weights paths resolve against {compiled.plan.data_root} on every node; "
                "add --data-root DIR to a line where the data is elsewhere on that node."
            )
    for command in commands:
        print(command)
    return 0


def plan_json(compiled) -> dict:
    return compiled.plan.model_dump(mode="json")


def _target(args, compiled) -> dict:
    """The step the run is to reach, and the plan file (for messages)."""
    return {"target": args.steps or compiled.plan.train.steps, "plan_file": args.file}


def _prepare_run_dir(args, compiled, run_dir: Path) -> str | None:
    """Check (or with --fresh, clear) an existing run directory; a sentence when it has already finished."""
    from planc.commands.run_checks import check_existing_run, discard
    from planc.rundir.state import inspect_run

    if run_dir.exists() and not run_dir.is_dir():
        return None  # write_run_dir explains
    state = inspect_run(run_dir)
    if args.fresh:
        discard(state, plan_json(compiled), dry_run=args.print_only)
        return None
    return check_existing_run(state, plan_json(compiled), fresh=False, **_target(args, compiled))


def _report(args, compiled, run_dir: Path, outcome) -> int:
    """What happened, in a few lines, and planc's exit status (recorded as the ``end`` event)."""
    from planc.errors import PlanError
    from planc.rundir.events import last_event, read_events, record_event

    plan = compiled.plan
    events = read_events(run_dir)
    launched = last_event(events, "launch")
    since = [e for e in events if launched is None or e["time"] >= launched["time"]]
    restarts = max(0, sum(e["event"] == "attempt" for e in since) - 1)
    again = f"planc run {args.file} --out {run_dir}"
    last = last_event(since, "stopped", "finished")  # a torchrun relaunch may stop a run, then finish it
    stopped = last if last is not None and last["event"] == "stopped" else None
    if outcome.stop_signal is not None or stopped is not None:
        status = _report_stop(outcome, stopped, again)
    elif outcome.status != 0:
        records = launch_records(run_dir)
        done = f"{records[-1]['step']} step(s) finished" if records else "no step finished"
        if plan.checkpoint is not None:
            hint = _rerun_hint(args, compiled, run_dir, again)
        else:
            hint = (
                "the plan has no checkpoint block, so a new run starts over; "
                "add `checkpoint { every = N }` to resume after failures"
            )
        record_event(run_dir, "end", status="failed", exit=1, restarts=restarts)
        raise PlanError(
            f"training failed after {restarts} restart(s) ({done}; metrics in {run_dir / 'metrics.jsonl'}); "
            f"`planc doctor {run_dir}` says what happened",
            hint=f"the failing rank's message is above; {hint}",
        )
    elif plan.checkpoint is not None and last is not None and not last.get("checkpoint"):
        _report_unsaved_finish(run_dir, last, again, restarts)
    else:
        status = 0
        records = launch_records(run_dir)
        if records:
            first, last = records[0], records[-1]
            extra = f", {restarts} restart(s)" if restarts else ""
            print(
                f"planc: done — {len(records)} step(s) logged{extra}, loss {first['loss']:.4f} → {last['loss']:.4f}; "
                f"{run_dir / 'metrics.jsonl'}",
                file=sys.stderr,
            )
    record_event(run_dir, "end", status="stopped" if stopped or outcome.stop_signal else "done", exit=status)
    return status


def _rerun_hint(args, compiled, run_dir: Path, again: str) -> str:
    """What running ``again`` after a failure will do: the same sentence as `planc doctor`'s advice."""
    from planc.rundir.diagnose import rerun_after_failure
    from planc.rundir.state import inspect_run

    return rerun_after_failure(inspect_run(run_dir), plan_json(compiled), again)


def _report_unsaved_finish(run_dir: Path, finished: dict, again: str, restarts: int) -> NoReturn:
    """Every step trained, but the last checkpoint could not be written (a full disk): not a success.

    The weights since the newest complete checkpoint exist nowhere, so the run ends non-zero and a run
    again resumes from that checkpoint and retrains them (see ``RunState.finished_at``).
    """
    from planc.errors import PlanError
    from planc.rundir.events import record_event
    from planc.rundir.state import inspect_run

    step = finished["step"]
    newest = inspect_run(run_dir).newest_checkpoint
    since = f"step {newest.step}" if newest else "step 0 (no complete checkpoint)"
    record_event(run_dir, "end", status="failed", exit=1, restarts=restarts, reason="final checkpoint not saved")
    raise PlanError(
        f"trained to step {step}, but the checkpoint of step {step} could not be saved (the reason is above); "
        f"the weights of steps {newest.step + 1 if newest else 1}-{step} are not saved anywhere: the newest complete "
        f"checkpoint is {newest.path.name if newest else 'none'}",
        hint=f"free space on the checkpoint's file system, then `{again}` resumes from {since} and trains the "
        "remaining steps again",
    )


def _report_stop(outcome, stopped: dict | None, again: str) -> int:
    """A stop asked for by a signal: 0 after SIGTERM with a checkpoint to resume from, 130 after Ctrl-C."""
    name = outcome.stop_signal or (stopped or {}).get("signal") or "a signal"
    checkpoint = (stopped or {}).get("checkpoint")
    if stopped is not None and checkpoint:
        print(
            f"planc: stopped by {name} after step {stopped['step']}; checkpoint {checkpoint} saved. "
            f"Resume with: {again}",
            file=sys.stderr,
        )
    elif stopped is not None:
        print(
            f"planc: stopped by {name} after step {stopped['step']} without a checkpoint there (the plan has no "
            f"checkpoint block, or the save failed: see above); `{again}` resumes from the newest complete "
            "checkpoint, if any, and repeats the steps since",
            file=sys.stderr,
        )
    else:
        print(f"planc: stopped by {name} before the workers could save (see above)", file=sys.stderr)
    if name == "SIGINT":
        print(
            "planc: interrupted; the run directory keeps metrics.jsonl and the last complete checkpoint",
            file=sys.stderr,
        )
        return 130
    return 0 if checkpoint else 128 + 15


def launch_records(run_dir: Path) -> list[dict]:
    from planc.rundir.metrics_file import read_metrics

    return read_metrics(run_dir)


def _run_in_place(compiled, registry, out_dir: Path, steps: int | None) -> int:
    """Already a torchrun worker: build the same job the program would, and train it here."""
    import os

    from planc import launch
    from planc.runtime.compose import compose
    from planc.runtime.loop import shutdown, train

    out_dir.mkdir(parents=True, exist_ok=True)
    if os.environ.get("RANK", "0") == "0":
        launch.write_run_dir(out_dir, compiled)
    job = compose(compiled.plan, compiled.layout, registry)
    try:
        train(job, steps=steps, out_dir=out_dir, predicted=compiled.prediction.numbers())
    finally:
        shutdown()
    return 0


def _with_steps_and_sinks(plan, steps: int | None, sinks: list[str]):
    """The plan with ``--log`` sinks added to ``train.log`` (so the program and plan.json carry them);
    refuses ``--steps`` past a schedule that has decayed to 0 before anything is launched."""
    from planc.errors import PlanError, did_you_mean, one_of
    from planc.runtime.sinks import known_sink_names
    from planc.spec.train import steps_beyond_schedule

    if steps is not None:
        refusal, _ = steps_beyond_schedule(plan.train, steps)  # the program itself warns about held min_lr
        if refusal:
            raise PlanError(refusal)
    known = known_sink_names()
    for name in sinks:
        if name not in known:
            raise PlanError(f"--log {name}: no such metrics sink", hint=did_you_mean(name, known) or one_of(known))
    if not sinks:
        return plan
    train = plan.train.model_copy(update={"log": tuple(dict.fromkeys([*plan.train.log, *sinks]))})
    return plan.model_copy(update={"train": train})
