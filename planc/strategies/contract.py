"""What the registry knows of one strategy module: whether it meets the contract, and the
contract's defaults filled in.

:func:`contract_problems` checks a module against :mod:`planc.strategies.api` (required
attributes, API version, hooks that are functions, ``Options`` a pydantic model, no misspelled
hook); :class:`LoadedStrategy` wraps a module that passed, calling its hooks with their
defaults and turning a third-party plugin's exception into a :class:`~planc.errors.PlanError`
that names it. Nothing here imports torch.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from planc.errors import PlanError, did_you_mean, one_of
from planc.spec.build import unit_mismatch
from planc.spec.fields import unit_kind_of
from planc.spec.issues import SpecError, SpecIssue
from planc.strategies import api
from planc.strategies.composition import BUILTIN_ORDER

if TYPE_CHECKING:
    from planc.cost.context import CostContext
    from planc.cost.estimate import Estimate
    from planc.runtime.job import Job
    from planc.spec.layout import Layout
    from planc.spec.plan import Plan

_T = TypeVar("_T")

#: The distribution whose strategies are built-ins (they win every name collision).
CORE_DISTRIBUTION = "planc"

_KNOWN_ATTRIBUTES = api.REQUIRED_ATTRIBUTES + api.OPTIONAL_ATTRIBUTES
#: How close an unknown public attribute must be to a hook name to be reported as its misspelling
#: (difflib ratio; "aply"/"apply" = 0.89, "Option"/"Options" = 0.92, "check_options"/"check" = 0.56).
_MISSPELLING_CUTOFF = 0.8


class _NoOptions(BaseModel):
    """The options of a strategy that declares none: the ``use`` block must be empty."""

    model_config = {"extra": "forbid", "frozen": True}


@dataclass(frozen=True)
class PluginProblem:
    """Something wrong with one registered strategy; the strategy was skipped unless ``skipped`` is False."""

    name: str
    """The entry-point name (the strategy name it tried to register)."""
    distribution: str
    """The distribution (pip package) that registered it."""
    version: str
    """That distribution's version."""
    message: str
    """What is wrong and what to do."""
    skipped: bool = True
    """Whether the strategy was left out of the registry (False for warnings)."""

    def __str__(self) -> str:
        verdict = "skipped" if self.skipped else "warning"
        return f"{self.name} (from {self.distribution} {self.version}): {self.message} [{verdict}]"


@dataclass(frozen=True)
class LoadedStrategy:
    """A strategy module that passed the contract checks, with the contract's defaults filled in."""

    name: str
    module: types.ModuleType
    distribution: str
    version: str

    @property
    def builtin(self) -> bool:
        return self.distribution == CORE_DISTRIBUTION

    @property
    def description(self) -> str:
        return str(self.module.DESCRIPTION)

    @property
    def options_model(self) -> type[BaseModel]:
        """The pydantic model that validates the ``use`` block (one with no fields when none is declared)."""
        model: type[BaseModel] = getattr(self.module, "Options", _NoOptions)
        return model

    @property
    def after(self) -> tuple[str, ...]:
        """Strategies that must be applied before this one when both are active."""
        return tuple(getattr(self.module, "AFTER", ()))

    def enabled(self, plan: Plan, layout: Layout) -> bool:
        """Whether the strategy takes part: the module's own rule, else "the plan names it in a use block"."""
        rule = getattr(self.module, "enabled", None)
        if rule is None:
            return any(use.name == self.name for use in plan.uses)
        return bool(self._call("enabled", rule, plan, layout))

    def check(self, plan: Plan, layout: Layout, options: BaseModel) -> str | None:
        """None when the strategy can apply, else the module's message saying why not."""
        rule = getattr(self.module, "check", None)
        if rule is None:
            return None
        message: str | None = self._call("check", rule, plan, layout, options)
        return message

    def cost(self, ctx: CostContext, estimate: Estimate, options: BaseModel) -> Estimate:
        """The module's pure cost pass; the identity when it declares none."""
        rule = getattr(self.module, "cost", None)
        if rule is None:
            return estimate
        result: Estimate = self._call("cost", rule, ctx, estimate, options)
        return result

    def _call(self, hook: str, function: Callable[..., _T], *args: Any) -> _T:
        """Run a plan-time hook; a third-party plugin's exception becomes a PlanError that names it
        (a built-in's is a bug in planc and propagates)."""
        if self.builtin:
            return function(*args)
        try:
            return function(*args)
        except Exception as exc:
            raise PlanError(
                f"strategy plugin '{self.name}' (from {self.distribution} {self.version}) failed in "
                f"{hook}(): {type(exc).__name__}: {exc}",
                hint=f"report it to the plugin's authors; PLANC_PLUGINS can leave it out "
                f"(e.g. PLANC_PLUGINS={','.join(BUILTIN_ORDER)})",
            ) from exc

    def apply(self, job: Job, options: BaseModel) -> None:
        """Run time: transform ``job`` with PyTorch's own implementation."""
        self.module.apply(job, options)

    def use_index(self, plan: Plan) -> int | None:
        """Index of this strategy's ``use`` block in the plan, if it has one."""
        for index, use in enumerate(plan.uses):
            if use.name == self.name:
                return index
        return None

    def options_for(self, plan: Plan, layout: Layout | None = None) -> BaseModel:
        """Validate the plan's ``use NAME { ... }`` options with the module's ``Options`` (defaults if absent).

        The validation context is ``{"plan": plan, "layout": layout}``: an Options model may fill
        layout-dependent defaults from it (the built-ins do), so an emitted program shows the
        values that will run. Raises :class:`~planc.spec.SpecError` addressed to
        ``("uses", index, "options", key)`` so the DSL layer can point at the offending option; an
        unknown option gets a did-you-mean hint.
        """
        index = self.use_index(plan)
        raw = dict(plan.uses[index].options) if index is not None else {}
        units = dict(plan.uses[index].units) if index is not None else {}
        return self.validate_options(raw, index, context={"plan": plan, "layout": layout}, units=units)

    def validate_options(
        self,
        raw: dict[str, Any],
        index: int | None = None,
        context: dict[str, Any] | None = None,
        units: dict[str, tuple[str, str]] | None = None,
    ) -> BaseModel:
        """``units``: the unit kind and text of each option written with a unit (from a .plan)."""
        model = self.options_model
        fields = list(model.model_fields)
        base = ("uses", index if index is not None else 0, "options")
        issues: list[SpecIssue] = []
        for key in raw:
            if key not in fields:
                if not fields:
                    hint = f"strategy '{self.name}' takes no options; remove them"
                else:
                    hint = did_you_mean(key, fields) or f"'{self.name}' takes {one_of(fields)}"
                issues.append(SpecIssue(base + (key,), f"unknown option '{key}' for strategy '{self.name}'", hint))
            elif units and key in units:  # a plain number is taken in base units, as from plan.json
                problem = unit_mismatch(
                    f"option '{key}' of strategy '{self.name}'", unit_kind_of(model.model_fields[key]), *units[key]
                )
                if problem:
                    issues.append(SpecIssue(base + (key,), *problem))
        if issues:
            raise SpecError(issues)
        try:
            return model.model_validate(raw, context=context)
        except ValidationError as exc:
            for err in exc.errors():
                loc = str(err["loc"][0]) if err["loc"] else None
                doc = model.model_fields[loc].description if loc in model.model_fields else None
                issues.append(
                    SpecIssue(
                        base + ((loc,) if loc is not None else ()),
                        f"option '{loc}' of strategy '{self.name}': {err['msg']}",
                        doc.splitlines()[0] if doc else None,
                    )
                )
            raise SpecError(issues) from None


def contract_problems(name: str, module: types.ModuleType) -> list[str]:
    """Why ``module`` does not meet the strategy contract (empty: it does)."""
    messages: list[str] = []
    missing = [attr for attr in api.REQUIRED_ATTRIBUTES if not hasattr(module, attr)]
    if missing:
        messages.append(
            "missing required attribute"
            + ("s " if len(missing) > 1 else " ")
            + ", ".join(missing)
            + " (see planc.strategies.api)"
        )
    version = getattr(module, "API_VERSION", None)
    if version is not None and version != api.API_VERSION:
        messages.append(
            f"declares API_VERSION = {version!r}, but this planc implements strategy API "
            f"version {api.API_VERSION}; install a version of the plugin made for it"
        )
    declared = getattr(module, "NAME", None)
    if declared is not None and declared != name:
        messages.append(f"NAME = {declared!r} differs from its entry-point name '{name}'; make them equal")
    for attr in ("apply", "enabled", "check", "cost"):
        if hasattr(module, attr) and not callable(getattr(module, attr)):
            messages.append(f"'{attr}' must be a function")
    options = getattr(module, "Options", None)
    if options is not None and not (isinstance(options, type) and issubclass(options, BaseModel)):
        messages.append("'Options' must be a pydantic BaseModel subclass")
    after = getattr(module, "AFTER", ())
    if isinstance(after, str) or not all(isinstance(a, str) for a in _iterable(after)):
        messages.append(f"AFTER must be a tuple of strategy names, got {after!r}")
    for attr, hook in _misspelled_hooks(module):
        messages.append(
            f"unknown attribute '{attr}': did you mean '{hook}'? A misspelled hook would be "
            "silently ignored, so the plugin is skipped until it is renamed"
        )
    return messages


def _iterable(value: Any) -> Iterable[Any]:
    try:
        return list(value)
    except TypeError:
        return [value]


def _misspelled_hooks(module: types.ModuleType) -> list[tuple[str, str]]:
    """(name, hook) for each public name the module defines that is close to, but not, a contract attribute."""
    lowered = {k.lower(): k for k in _KNOWN_ATTRIBUTES}
    suspicious = []
    for attr, value in vars(module).items():
        if attr.startswith("_") or attr in _KNOWN_ATTRIBUTES or not _defined_here(module, value):
            continue
        close = difflib.get_close_matches(attr.lower(), lowered, n=1, cutoff=_MISSPELLING_CUTOFF)
        if close:
            suspicious.append((attr, lowered[close[0]]))
    return suspicious


def _defined_here(module: types.ModuleType, value: Any) -> bool:
    """Whether ``value`` is the module's own (not an import such as ``annotations`` or ``torch``)."""
    if isinstance(value, types.ModuleType):
        return False
    if isinstance(value, (types.FunctionType, type)):
        return getattr(value, "__module__", None) == module.__name__
    return isinstance(value, (str, int, float, tuple, list, dict, bool))
