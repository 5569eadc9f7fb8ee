"""``planc explain FILE``: what layout planc chooses for a plan, and why, with numbers.

Exit status: 0 when a fitting layout is chosen; 1 when nothing fits or the plan's fixed layout
does not fit (the explanation is still printed, with what would fit).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from planc.errors import PlanError, error_dict

if TYPE_CHECKING:
    from planc.explain.report import TakingPart
    from planc.spec.layout import Layout
    from planc.spec.plan import Plan
    from planc.strategies.registry import Registry

HELP = "explain the layout planc chooses: memory, step time, throughput, and why not simpler"
DESCRIPTION = (
    "Plan the layout of FILE (a .plan file, or a plan.json) and explain the choice: memory per "
    "device, step time broken into compute, communication and bubble, throughput, the bottleneck, "
    "why each simpler strategy was rejected, and the next-best layouts. Exits 1 when nothing fits."
)


def add_arguments(parser) -> None:
    from planc.commands import tolerance

    parser.add_argument("file", help="the .plan file (or a plan.json written by planc)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--svg", metavar="OUT", help="also write a picture of memory and pipeline schedule")
    parser.add_argument(
        "--tolerance",
        type=tolerance,
        default=None,
        help="pick the simplest layout within this fraction of the best throughput "
        "(default: the plan's layout.tolerance; auto = the cost model's measured uncertainty and a 5 ms floor)",
    )
    parser.add_argument("--top", type=int, default=5, metavar="K", help="how many alternatives to list (default 5)")
    parser.add_argument(
        "--runtime",
        default="planc",
        metavar="NAME",
        help="predict for this training program: planc (default: the program planc emits) or "
        "megatron-lm-2021 (Megatron-LM as Narayanan et al. 2021 ran it: fused kernels, "
        "materialized attention) or megatron-core-2024 (Megatron-Core with Transformer Engine on H100); "
        "the last two compare a plan with published runs",
    )


def read_plan(path_text: str, registry: Registry) -> Plan:
    """A validated Plan from a .plan file (via the DSL, ``use`` blocks checked against ``registry``)
    or a plan.json."""
    path = Path(path_text)
    if path.suffix == ".json":
        if not path.exists():
            raise PlanError(f"no such file: {path_text}", hint="give the path of a .plan file or a plan.json")
        if not path.is_file():
            raise PlanError(f"{path_text} is not a regular file", hint="give the path of a plan.json file")
        from planc.spec.plan_json import plan_from_json_text

        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, ValueError) as exc:
            raise PlanError(f"cannot read {path_text}: {exc}") from None
        return plan_from_json_text(text, path_text)
    try:
        from planc.dsl.load import load_plan
    except ImportError:
        raise PlanError(
            "this planc has no .plan reader (planc.dsl) installed",
            hint="install the complete planc package, or pass a plan.json",
        ) from None
    return load_plan(path, strategies=registry)


def _misfit(choice) -> PlanError | None:
    """The error explain ends with when nothing fits (None when the choice fits)."""
    from planc.explain.words import suggestion_text

    if choice.fits:
        return None
    what = "the plan's fixed layout does not fit" if choice.fixed else "no layout fits"
    return PlanError(
        f"{what} in {choice.estimate.capacity / 2**30:.1f} GiB per device",
        hint=suggestion_text(choice.suggestion) if choice.suggestion else None,
    )


def _measured(plan, choice, file: str, runtime: str, registry) -> tuple[dict, str]:
    """(explain --json's "measured" and "simulated", the text's tables) from a `planc verify` and a
    `planc verify --simulate` of this very plan; empty without them. The peak rows' prediction is
    related to the total of ``choice``'s memory-table stage. ``file``: the plan's path, under which
    a result of an earlier version of it is looked for when there is none of this one. Empty for
    another ``runtime`` than planc's: verify measures planc's program, and beside a prediction for
    another program its table would compare the two."""
    from planc.verify import measured, results

    body: dict = {}
    text = ""
    if runtime != "planc":
        return body, text
    layout, memory = choice.layout, choice.estimate.memory
    fingerprint = None  # read (hashing the predicting code) only when a stored result is shown
    for kind, key in (("verify", "measured"), ("simulate", "simulated")):
        command = "planc verify" + (" --simulate" if kind == "simulate" else "")
        try:
            found = results.load(plan, layout, kind)
        except results.UnreadableResult as exc:
            print(
                f"note: a stored `{command}` result of this plan is not shown: {exc}; "
                f"`{command}` of the plan again replaces it",
                file=sys.stderr,
            )
            continue
        if found is None and (earlier := results.earlier_version(Path(file), kind)) is not None:
            print(
                f"note: `{command}` measured {file} before it, or the layout chosen for it, changed "
                f"({earlier}): not shown; `{command} {file}` measures it as it is now",
                file=sys.stderr,
            )
        if found:
            fingerprint = fingerprint or results.cost_model_fingerprint(
                results.plugin_cost_sources(plan, layout, registry)
            )
            body[key] = measured.measured_dict(found, memory, fingerprint)
            text += "\n" + "\n".join(measured.measured_lines(found, memory, pipelined=layout.pp > 1)) + "\n"
            if body[key]["predicted_by_another_model"]:
                print(
                    f"note: the `{command}` result shown was predicted by other cost-model code than this "
                    f"planc's (an earlier version): its predicted column may differ from the tables above; "
                    f"`{command} {file}` compares today's predictions",
                    file=sys.stderr,
                )
    return body, text


def _warn_if_runtime_cannot_run(name: str, profile, plan) -> None:
    """A ``--runtime`` for NVIDIA GPUs on a CPU plan prices a program that cannot run there: the
    numbers are the formulas', not a prediction for anything this plan can run."""
    if profile.gpu_only and plan.hardware.is_cpu:
        print(
            f"warning: --runtime {name} describes {profile.name}, a program for NVIDIA GPUs; "
            f'this plan runs on device = "cpu", so its numbers describe a program that cannot run there '
            "(leave --runtime out to predict planc's own CPU program)",
            file=sys.stderr,
        )


def taking_part_in(plan: Plan, layout: Layout, registry: Registry) -> list[TakingPart]:
    """The strategies the program for ``layout`` applies, as explain lists them."""
    from planc.explain.report import TakingPart

    return [
        TakingPart(s.name, s.builtin, s.distribution, s.version, s.use_index(plan) is not None)
        for s in registry.active(plan, layout)
    ]


def plugins_taking_part(plan: Plan, layout: Layout, registry: Registry) -> str:
    """explain's words for the third-party plugins the program for ``layout`` applies, for the
    layout lines of ``planc run`` and ``planc verify`` ("" when only built-ins take part)."""
    from planc.explain.report import plugins_text

    return plugins_text(taking_part_in(plan, layout, registry))


def run(args) -> int:
    from planc.explain.report import render_text, to_dict
    from planc.planner import NoLegalLayout, choose

    if args.top < 0:
        raise PlanError("--top must be 0 or more")
    from planc.cost import PROFILES
    from planc.errors import did_you_mean

    if args.runtime not in PROFILES:
        raise PlanError(
            f"unknown --runtime {args.runtime!r}",
            hint=did_you_mean(args.runtime, PROFILES) or "one of: " + ", ".join(PROFILES),
        )
    profile = PROFILES[args.runtime]
    from planc.strategies.registry import load_registry

    registry = load_registry()
    plan = read_plan(args.file, registry)
    try:
        choice = choose(plan, registry, tolerance=args.tolerance, top_k=args.top, profile=profile)
    except NoLegalLayout as exc:
        raise PlanError(str(exc), hint=exc.hint) from None
    registry.require(plan, choice.layout)  # what `planc compile` would refuse, explain refuses too
    from dataclasses import replace

    from planc.planner.advice import advise

    choice = replace(choice, advice=advise(plan, choice, registry, profile))
    taking_part = taking_part_in(plan, choice.layout, registry)
    for warning in [*registry.unused_uses(plan, choice.layout), *map(str, registry.notices())]:
        print(f"warning: {warning}", file=sys.stderr)
    _warn_if_runtime_cannot_run(args.runtime, profile, plan)
    misfit = _misfit(choice)
    if args.svg:  # before any output: a failure here must not follow a printed JSON object
        from planc.explain.svg import render_svg
        from planc.fileio import write_output

        write_output(
            Path(args.svg), render_svg(plan, choice), option="--svg", inputs=(Path(args.file),), example="plan.svg"
        )
    measured_json, measured_text = _measured(plan, choice, args.file, args.runtime, registry)
    if args.json:
        # One object: the explanation, and with "error" when nothing fits (exit status 1).
        error = {"error": error_dict(misfit)} if misfit else {}
        body = {**error, **to_dict(plan, choice, taking_part), "runtime": args.runtime, **measured_json}
        json.dump(body, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        text = render_text(plan, choice, top_k=args.top, strategies=taking_part) + measured_text
        if args.runtime != "planc":
            first, rest = text.split("\n", 1)
            text = f"{first}\n  runtime   {profile.name} (a prediction only: planc runs its own program)\n{rest}"
        sys.stdout.write(text)
    if misfit is not None:
        hint = f"; {misfit.hint}" if misfit.hint else ""
        print(f"planc: {misfit.message}{hint}", file=sys.stderr)
        return 1
    return 0
