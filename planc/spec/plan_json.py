"""Reading a plan back from JSON: what ``planc check --json`` prints, or a run directory's
``plan.json`` (which wraps it as ``{"plan": ..., "layout": ..., ...}``).

JSON skips the ``.plan`` reader but not the rules: fields are validated by the models and the
cross-key checks run as for a ``.plan`` file, so an edited plan.json gets the same answers.
"""

from __future__ import annotations

from pydantic import ValidationError

from planc.errors import PlanError
from planc.spec import strict_json
from planc.spec.checks import run_checks
from planc.spec.plan import Plan

#: How many problems one error message lists.
SHOWN = 5


def plan_from_json_text(text: str, shown: str) -> Plan:
    """The validated Plan in ``text`` (a plan, or a run directory's record); PlanError if none."""
    try:
        document = strict_json.loads(text)
    except ValueError as exc:
        raise PlanError(
            f"{shown} is not valid JSON: {exc}", hint="pass a .plan file, or a plan.json written by planc"
        ) from None
    if isinstance(document, dict) and isinstance(document.get("plan"), dict) and "layout" in document:
        document = document["plan"]  # a run directory's plan.json
    if not isinstance(document, dict):
        raise PlanError(
            f"{shown} does not hold a plan (a JSON object)", hint="pass a .plan file, or a plan.json written by planc"
        )
    try:
        plan = Plan.model_validate(document).model_copy(update={"source": shown})
    except ValidationError as exc:
        raise PlanError(
            f"{shown} is not a valid plan: "
            + _problems((".".join(map(str, e["loc"])) or "(top level)", e["msg"]) for e in exc.errors()),
            hint="fix the named keys, or regenerate it with `planc check --json`",
        ) from None
    issues = run_checks(plan)
    if issues:
        raise PlanError(
            f"{shown} is not a valid plan: "
            + _problems((".".join(map(str, i.path)) or "(plan)", i.message) for i in issues),
            hint=issues[0].hint,
        )
    return plan


def _problems(pairs) -> str:
    pairs = list(pairs)
    text = "; ".join(f"{where}: {what}" for where, what in pairs[:SHOWN])
    return text + (f"; and {len(pairs) - SHOWN} more" if len(pairs) > SHOWN else "")


__all__ = ["plan_from_json_text"]
