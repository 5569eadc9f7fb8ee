"""From a validated plan to a runnable program: plan the layout, gather the strategies, emit.

``compile_plan`` is what ``planc compile`` and ``planc run`` share. It never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from planc.codegen.emit import Prediction, StrategyCall, emit_program, torchrun_command
from planc.errors import PlanError
from planc.spec.layout import Layout
from planc.spec.plan import Plan

if TYPE_CHECKING:
    from planc.strategies.registry import Registry


@dataclass(frozen=True)
class CompiledPlan:
    plan: Plan
    layout: Layout
    strategies: tuple[StrategyCall, ...]
    prediction: Prediction
    fits: bool
    program: str
    warnings: tuple[str, ...] = ()


def compile_plan(
    plan: Plan,
    registry: Registry,
    *,
    tolerance: float | None = None,
    force: bool = False,
    program_name: str = "train.py",
) -> CompiledPlan:
    """Choose the layout (the planner), check and collect the active strategies of ``registry``,
    emit the program.

    Raises :class:`PlanError` when the strategies reject the layout, or when the layout is
    predicted not to fit in device memory (unless ``force``).
    """
    from planc.planner import NoLegalLayout, choose

    issues = registry.validate_uses(plan)  # before planning: the cost passes need valid options
    if issues:
        raise PlanError(
            "; ".join(issue.message for issue in issues), hint=next((i.hint for i in issues if i.hint), None)
        )
    try:
        choice = choose(plan, registry, tolerance=tolerance)
    except NoLegalLayout as exc:
        raise PlanError(str(exc), hint=exc.hint) from None
    estimate = choice.estimate
    prediction = Prediction(
        memory_bytes=estimate.memory_bytes,
        capacity_bytes=estimate.capacity,
        step_s=estimate.step_s,
        tokens_per_s=estimate.tokens_per_s,
        **_explain_words(plan, choice),
        steady_after=max(registry.steady_after(plan, choice.layout).values(), default=0),
    )
    if not choice.fits and not force:
        from planc.explain.words import suggestion_text
        from planc.units import format_bytes

        what = suggestion_text(choice.suggestion) if choice.suggestion else "run `planc explain` to see what would fit"
        raise PlanError(
            f"the layout {choice.layout.describe()} needs {format_bytes(prediction.memory_bytes)} per device, "
            f"but {plan.hardware.device} has {_capacity_text(plan, prediction.capacity_bytes)}",
            hint=what + "; pass --force to emit the program anyway",
        )
    registry.require(plan, choice.layout)
    calls = tuple(
        StrategyCall(
            name=strategy.name,
            module=strategy.module.__name__,
            builtin=strategy.builtin,
            description=strategy.description,
            options=strategy.options_for(plan, choice.layout).model_dump(mode="json", exclude_defaults=True),
        )
        for strategy in registry.active(plan, choice.layout)
    )
    program = emit_program(plan, choice.layout, calls, prediction=prediction, program_name=program_name)
    warnings = tuple(str(problem) for problem in registry.problems) + tuple(registry.unused_uses(plan, choice.layout))
    return CompiledPlan(
        plan=plan,
        layout=choice.layout,
        strategies=calls,
        prediction=prediction,
        fits=choice.fits,
        program=program,
        warnings=warnings,
    )


__all__ = ["CompiledPlan", "compile_plan", "emit_program", "torchrun_command", "StrategyCall", "Prediction"]


def _explain_words(plan: Plan, choice) -> dict[str, Any]:
    """What explain says about the prediction, from the functions explain prints with: the step
    time's band (or "(uncalibrated)"), with its number, and the close-to-the-limit memory warning."""
    from planc.cost.uncertainty import step_time_uncertainty
    from planc.explain.advice_words import advice_text
    from planc.explain.totals import band_text
    from planc.planner.advice import close_to_limit

    warning = close_to_limit(choice)
    band = step_time_uncertainty(plan.hardware)
    return {
        "step_band": band_text(band),
        "step_uncertainty": band,
        "memory_warning": advice_text(warning) if warning is not None else "",
    }


def _capacity_text(plan: Plan, capacity_bytes: float) -> str:
    """``3.8 GiB (4.0 GiB less 5% headroom)``: what a layout may use, and why it is not the memory."""
    from planc.units import format_bytes

    hw = plan.hardware
    less = f" ({format_bytes(hw.memory)} less {hw.headroom:.0%} headroom)" if hw.headroom else ""
    return format_bytes(capacity_bytes) + less
