"""``planc verify FILE``: run the emitted program for a few steps and hold its measurements
against the cost model's prediction, per rank (see docs/verify.md)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

HELP = "run the plan's program for a few measured steps and compare with the prediction"
DESCRIPTION = (
    "Compile the plan, run the emitted program for a few steps with planc's measurement hook "
    "(PLANC_VERIFY=1: same program, same arithmetic) and print, per rank, predicted beside measured: "
    "model-state bytes, activation bytes saved for backward, communication bytes by mesh dimension, "
    "peak memory and step time, with the relative error. Runs on the plan's hardware when this "
    "machine has it, else on CPU processes with the same layout (shrinking the model, batch or data "
    "parallelism where a CPU run needs it, and saying so). Results go to the run directory "
    "(verify.json) and are shown by `planc explain` for the same plan. With --simulate: the plan's memory per "
    "rank at its full world size, on fake tensors in this one process (simulate.json)."
)

#: warm-up, timed, communication + activations, peak memory (planc.verify.probe)
MIN_STEPS = 4
#: ... and the step the probe profiles on CUDA (a timed one on CPU)
DEFAULT_STEPS = 5


def add_arguments(parser) -> None:
    parser.add_argument("file", help="the .plan file")
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help=f"steps to run (at least {MIN_STEPS}; default {DEFAULT_STEPS}: on CUDA the 5th is profiled)",
    )
    parser.add_argument("--out", help="run directory (default: runs/<plan>-verify-<timestamp>)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="check memory at the plan's full world size in this one process (fake tensors, fake process group)",
    )
    parser.add_argument("--ranks", help="with --simulate: the ranks to simulate, e.g. 0,7 (default: those that differ)")


def run(args) -> int:
    if args.simulate:
        from planc.commands.verify_simulate import run_simulation

        return run_simulation(args)
    if args.ranks:
        from planc.errors import PlanError

        raise PlanError("--ranks is an option of --simulate", hint="planc verify FILE --simulate --ranks 0,7")
    return _run_program(args)


def _run_program(args) -> int:
    from planc import launch
    from planc.codegen import compile_plan
    from planc.commands.explain import plugins_taking_part
    from planc.commands.verify_io import load_for_verify, print_result
    from planc.errors import PlanError
    from planc.verify import results
    from planc.verify.stand_in import CannotStandIn, stand_in

    if args.steps < MIN_STEPS:
        raise PlanError(
            f"--steps must be at least {MIN_STEPS}, got {args.steps}",
            hint="verify measures one thing per step after a warm-up step: time, traffic and activations, peak memory",
        )
    plan_path, registry, plan = load_for_verify(args.file, "planc verify", "launches its own processes")
    compiled, measured, steady, unmeasured = _compiled_with_unmeasured_steps(plan, registry, args.steps)
    try:
        chosen = stand_in(measured, compiled.layout, _cuda_devices())
    except CannotStandIn as exc:
        raise PlanError(
            f"cannot run this plan here: {exc}", hint="check its memory at full size with planc verify --simulate"
        ) from None
    layout_as_planned = compiled.layout  # the key explain finds the result under
    if chosen.changes:
        compiled = compile_plan(chosen.plan, registry, force=True)
    run_dir = Path(args.out) if args.out else launch.default_run_dir(plan_path.with_name(plan_path.stem + "-verify"))
    launch.write_run_dir(run_dir, compiled)
    for change in chosen.changes:
        print(f"planc verify: stand-in: {change}", file=sys.stderr)
    print(
        f"planc verify: {compiled.layout.describe()} · {compiled.plan.world_size} process(es) · {run_dir}",
        file=sys.stderr,
    )
    plugins = plugins_taking_part(compiled.plan, compiled.layout, registry)
    if plugins:
        print(f"planc verify: plugins {plugins}", file=sys.stderr)
    if steady:
        print(f"planc verify: {_unmeasured_text(steady, unmeasured)}", file=sys.stderr)

    with _measuring_program_on_stderr(unmeasured):
        outcome = launch.launch_local(compiled, run_dir, steps=unmeasured + args.steps)
    status = getattr(outcome, "status", outcome)  # an Outcome (planc.supervise) or an exit status
    if status != 0 or getattr(outcome, "stop_signal", None):
        raise PlanError(f"the program failed (exit {status}); its output is above", hint=f"run directory: {run_dir}")
    result = collect(compiled.plan, compiled.layout, registry, run_dir)
    result.update(
        key=results.plan_key(plan, layout_as_planned),
        plan_source=results.source_of(plan_path),
        cost_model=results.cost_model_fingerprint(results.plugin_cost_sources(plan, layout_as_planned, registry)),
        stand_in=list(chosen.changes),
        unmeasured=_unmeasured_text(steady, unmeasured) if steady else None,
    )
    print_result(args, result, render, run_dir, results.save(result, run_dir), "verify.json")
    return 0


#: The most steps verify runs unmeasured before a strategy works as priced; past it, it measures
#: the steps before (and says so): a compressor that starts after 100,000 steps is not worth an
#: hour of waiting to check its first minutes.
MAX_UNMEASURED_STEPS = 200


def _compiled_with_unmeasured_steps(plan, registry, steps: int):
    """(the program to launch, its plan, {strategy: steps}, steps to run unmeasured): the steps some
    strategy runs before it works as priced (a compressor's uncompressed start, its
    ``steady_after``) run first, unmeasured -- up to :data:`MAX_UNMEASURED_STEPS` -- so that verify
    measures ``steps`` the prediction describes; the schedule is laid over all of them."""
    from planc.codegen import compile_plan

    first = _schedule_over(plan, steps, quiet=True)
    compiled = compile_plan(first, registry)
    steady = registry.steady_after(compiled.plan, compiled.layout)
    unmeasured = max(steady.values(), default=0)
    if unmeasured > MAX_UNMEASURED_STEPS:
        unmeasured = 0
    measured = _schedule_over(plan, unmeasured + steps)
    if measured is not first:
        compiled = compile_plan(measured, registry)
    return compiled, measured, steady, unmeasured


def _schedule_over(plan, steps: int, *, quiet: bool = False):
    """The plan with its learning-rate schedule laid over at least ``steps`` steps.

    verify measures time, traffic and memory, which the learning rate does not change; but the program
    refuses to train past ``train.steps`` when the schedule has decayed to ``min_lr = 0`` there (see
    :func:`planc.spec.train.steps_beyond_schedule`), so a plan shorter than verify's own ``--steps`` would
    fail in every rank. The result is still filed under the plan as written (``results.plan_key``).
    """
    if steps <= plan.train.steps:
        return plan
    if not quiet:
        print(
            f"planc verify: train.steps = {plan.train.steps} is below the {steps} steps verify runs; "
            f"the learning-rate schedule is laid over {steps} steps for the measurement",
            file=sys.stderr,
        )
    return plan.model_copy(update={"train": plan.train.model_copy(update={"steps": steps})})


def _unmeasured_text(steady: dict[str, int], unmeasured: int) -> str:
    """verify's words for the steps run before the strategies work as priced."""
    which = ", ".join(f"{name} after {steps}" for name, steps in steady.items())
    if unmeasured:
        return f"the first {unmeasured} steps run unmeasured (working as priced: {which})"
    return (
        f"working as priced only after more steps than verify runs first ({MAX_UNMEASURED_STEPS}): {which}; "
        "the steps measured come before, and their traffic and time are not what is predicted "
        "(lower the plugin's start option to check the priced steps)"
    )


@contextlib.contextmanager
def _measuring_program_on_stderr(unmeasured: int = 0):
    """PLANC_VERIFY=1 for the launched program, whose progress lines go to stderr: stdout is
    verify's table (or JSON) alone; PLANC_VERIFY_UNMEASURED: steps its probe leaves alone first."""
    from planc.verify.probe import ENVIRONMENT_VARIABLE, UNMEASURED_VARIABLE

    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    os.environ[ENVIRONMENT_VARIABLE] = "1"
    os.environ[UNMEASURED_VARIABLE] = str(unmeasured)
    try:
        yield
    finally:
        os.environ.pop(ENVIRONMENT_VARIABLE, None)
        os.environ.pop(UNMEASURED_VARIABLE, None)
        os.dup2(saved, 1)
        os.close(saved)


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def collect(plan, layout, registry, run_dir: Path) -> dict:
    """Read every rank's ``verify/rank<R>.json`` and put the prediction beside each number."""
    from planc.commands.explain import taking_part_in
    from planc.errors import PlanError
    from planc.verify.predicted import estimate_for, predicted_for_rank
    from planc.verify.report import rows_for_rank, step_time_basis

    ctx, estimate = estimate_for(plan, layout, registry)
    records = []
    for rank in range(plan.world_size):
        path = run_dir / "verify" / f"rank{rank}.json"
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            raise PlanError(
                f"rank {rank} wrote no measurements ({path})", hint="the program's output is above"
            ) from None
    rows = []
    for record in records:
        rows.extend(
            rows_for_rank(
                record, predicted_for_rank(ctx, estimate, record["coordinates"]["pp"], record["coordinates"]["dp"])
            )
        )
    return {
        "layout": layout.model_dump(mode="json"),
        "describe": layout.describe(),
        "strategies": [asdict(s) for s in taking_part_in(plan, layout, registry)],  # as explain --json
        "world_size": plan.world_size,
        "device": records[0].get("device", "cpu"),
        "rows": [row.as_dict() for row in rows],
        "ranks": records,
        "step_time_basis": step_time_basis(plan.hardware),
    }


def render(result: dict) -> str:
    from planc.explain.report import TakingPart, plugins_lines
    from planc.verify.report import Row, format_rows

    rows = [Row(**{k: v for k, v in r.items() if k != "error"}) for r in result["rows"]]
    head = [f"verify  {result['describe']} · {result['world_size']} process(es) on {result['device']}"]
    head += plugins_lines([TakingPart(**s) for s in result.get("strategies", [])])  # explain's line
    for change in result.get("stand_in", []):
        head.append(f"  stand-in: {change}")
    if result.get("unmeasured"):
        head.append(f"  {result['unmeasured']}")
    head.append("  error = predicted / measured - 1")
    text = "\n".join(head) + "\n\n" + format_rows(rows)
    basis = result.get("step_time_basis")
    return text + (f"\n\nnote: {basis}" if basis else "")
