"""``planc run FILE``: compile into a run directory and launch torchrun (or run in place under it)."""

from __future__ import annotations

import sys
from pathlib import Path

HELP = "compile a plan into a run directory and train it under torchrun"
DESCRIPTION = (
    "Compile the plan into a run directory (plan.json, train.py, metrics.jsonl, checkpoints/) and "
    "launch it with torchrun on this machine. A multi-node plan prints the torchrun command for "
    "each node instead (--slurm writes an sbatch script). Under torchrun already, it trains in place. "
    "Running again with the same --out resumes from the newest checkpoint."
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
    plan_path = Path(args.file)
    registry = load_registry()
    plan = _with_steps_and_sinks(load_plan(plan_path, strategies=registry), args.steps, args.log)
    compiled = compile_plan(plan, registry, tolerance=args.tolerance, force=args.force)
    if launch.under_torchrun():
        return _run_in_place(compiled, registry, Path(args.out or "."), args.steps)

    run_dir = Path(args.out) if args.out else launch.default_run_dir(plan_path)
    launch.write_run_dir(run_dir, compiled)
    for warning in compiled.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    hw = plan.hardware
    print(
        f"planc: {plan.model.name or 'model'} · {compiled.layout.describe()} · "
        f"{hw.world_size} process(es) · run directory {run_dir}",
        file=sys.stderr,
    )

    if args.slurm:
        script = run_dir / "launch.slurm"
        launch.write_text_atomically(script, launch.slurm_script(compiled, run_dir, steps=args.steps))
        print(f"wrote {script}; submit it with: sbatch {script}")
        return 0
    if hw.nodes > 1 or args.print_only:
        commands = (
            launch.multi_node_commands(compiled, run_dir, steps=args.steps)
            if hw.nodes > 1
            else [launch.local_command(compiled, run_dir, steps=args.steps)]
        )
        if hw.nodes > 1:
            print(
                f"This plan spans {hw.nodes} nodes. Copy {run_dir} to every node (or use a shared "
                f"filesystem), set MASTER_ADDR to node 0's address, and run on node i the i-th line:"
            )
            if plan.data_root is not None:
                print(
                    f"Relative data and weights paths resolve against {plan.data_root} on every node; "
                    "add --data-root DIR to a line where the data is elsewhere on that node."
                )
        for command in commands:
            print(command)
        return 0

    require_torch("planc run", *(["safetensors"] if plan.model.init == "pretrained" else []))
    launch.check_local_devices(compiled)
    status = launch.launch_local(compiled, run_dir, steps=args.steps)
    records = launch.last_metrics(run_dir)
    if status == 130:
        print(f"planc: interrupted; {run_dir} keeps metrics.jsonl and the last complete checkpoint", file=sys.stderr)
        return 130
    if status != 0:
        done = f"{records[-1]['step']} step(s) finished" if records else "no step finished"
        if plan.checkpoint is not None:
            again = (
                f"fix the cause, then `planc run {args.file} --out {run_dir}` resumes from the newest "
                f"complete checkpoint in {run_dir / plan.checkpoint.dir}"
            )
        else:
            again = (
                "the plan has no checkpoint block, so a new run starts over; "
                "add `checkpoint { every = N }` to resume after failures"
            )
        raise PlanError(
            f"training failed ({done}; metrics in {run_dir / 'metrics.jsonl'})",
            hint=f"the failing rank's message is above; {again}",
        )
    if records:
        first, last = records[0], records[-1]
        print(
            f"planc: done — {len(records)} step(s) logged, loss {first['loss']:.4f} → {last['loss']:.4f}; "
            f"{run_dir / 'metrics.jsonl'}",
            file=sys.stderr,
        )
    return 0


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
    prediction = compiled.prediction
    try:
        train(job, steps=steps, out_dir=out_dir, predicted={"step_s": prediction.step_s})
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
