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
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from planc.errors import PlanError, debug_traceback, did_you_mean, one_of
from planc.spec.build import unit_mismatch
from planc.spec.fields import unit_kind_of
from planc.spec.invalid import describe_invalid, invalid_hint
from planc.spec.issues import SpecError, SpecIssue
from planc.strategies import api
from planc.strategies.composition import BUILTIN_ORDER
from planc.units import Quantity, QuantityKind, format_literal, is_bare_number

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


class PluginError(PlanError):
    """A third-party plugin's plan-time hook raised; ``strategy`` names the plugin, so a caller that
    knows the plan's ``use`` blocks can point at the one that names it."""

    def __init__(self, strategy: str, detail: str, *, origin: str, hint: str | None = None) -> None:
        super().__init__(f"strategy plugin '{strategy}' ({origin}) {detail}", hint=hint)
        self.strategy = strategy
        self.detail = detail
        """What failed, without the plugin's name: ``failed in check() at f.py:8: KeyError: 'x'``."""


def raised_at(exc: BaseException, module: str) -> str | None:
    """``file:line`` of the innermost frame of ``exc``'s traceback that runs code of ``module``'s
    top-level package (a plugin's own code, however deep in pydantic or planc the exception was
    finally raised), or of the file a SyntaxError points into; None when no frame is the plugin's."""
    package = module.split(".")[0]
    where = None
    tb = exc.__traceback__
    while tb is not None:
        name = str(tb.tb_frame.f_globals.get("__name__", ""))
        if name == package or name.startswith(package + "."):
            where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    if where is None and isinstance(exc, SyntaxError) and exc.filename:
        where = f"{exc.filename}:{exc.lineno}"
    return where


def use_index(plan: Plan, name: str) -> int | None:
    """Index of the plan's ``use NAME`` block, if it has one."""
    return next((index for index, use in enumerate(plan.uses) if use.name == name), None)


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
    notice: bool = False
    """Whether ``planc check`` and ``explain`` show it too (it changes every plan, not only the ones
    that name the plugin; :meth:`~planc.strategies.registry.Registry.notices`)."""

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
        return bool(self._call("enabled", plan, rule, plan, layout))

    def check(self, plan: Plan, layout: Layout, options: BaseModel) -> str | None:
        """None when the strategy can apply, else the module's message saying why not."""
        rule = getattr(self.module, "check", None)
        if rule is None:
            return None
        message: str | None = self._call("check", plan, rule, plan, layout, options)
        return message

    def cost(self, ctx: CostContext, estimate: Estimate, options: BaseModel) -> Estimate:
        """The module's pure cost pass; the identity when it declares none."""
        rule = getattr(self.module, "cost", None)
        if rule is None:
            return estimate
        result: Estimate = self._call("cost", ctx.plan, rule, ctx, estimate, options)
        return result

    def steady_after(self, plan: Plan, options: BaseModel) -> int:
        """Optimizer steps before the strategy runs as its cost pass prices it (0 when it declares
        no ``steady_after``); anything but a whole number of 0 or more is the plugin's error."""
        rule = getattr(self.module, "steady_after", None)
        if rule is None:
            return 0
        steps = self._call("steady_after", plan, rule, plan, options)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise PluginError(
                self.name,
                f"steady_after() returned {steps!r}, not a whole number of steps (0 or more)",
                origin=f"from {self.distribution} {self.version}",
                hint=f"fix the plugin (or report it to its authors, {self.distribution})",
            )
        return steps

    def _call(self, hook: str, plan: Plan, function: Callable[..., _T], *args: Any) -> _T:
        """Run a plan-time hook; a third-party plugin's exception becomes a :class:`PluginError`
        that names it and the line of its own code that failed (a built-in's is a bug in planc
        and propagates). The hint depends on whether ``plan`` names the plugin: leaving it out
        with PLANC_PLUGINS would turn the plan's ``use`` block into an unknown name."""
        if self.builtin:
            return function(*args)
        try:
            return function(*args)
        except Exception as exc:
            debug_traceback(exc)
            where = raised_at(exc, self.module.__name__)
            if self.use_index(plan) is not None:
                hint = (
                    f"fix the plugin (or report it to its authors, {self.distribution}), "
                    f"or remove the `use {self.name}` block from the plan"
                )
            else:
                hint = (
                    "report it to the plugin's authors; PLANC_PLUGINS can leave it out "
                    f"(e.g. PLANC_PLUGINS={','.join(BUILTIN_ORDER)})"
                )
            raise PluginError(
                self.name,
                f"failed in {hook}(){f' at {where}' if where else ''}: {type(exc).__name__}: {exc}",
                origin=f"from {self.distribution} {self.version}",
                hint=hint,
            ) from exc

    def apply(self, job: Job, options: BaseModel) -> None:
        """Run time: transform ``job`` with PyTorch's own implementation."""
        self.module.apply(job, options)

    def use_index(self, plan: Plan) -> int | None:
        """Index of this strategy's ``use`` block in the plan, if it has one."""
        return use_index(plan, self.name)

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
        unitless = plan.uses[index].unitless if index is not None else ()
        return self.validate_options(
            raw, index, context={"plan": plan, "layout": layout}, units=units, unitless=unitless
        )

    def validate_options(
        self,
        raw: dict[str, Any],
        index: int | None = None,
        context: dict[str, Any] | None = None,
        units: dict[str, tuple[str, str]] | None = None,
        unitless: Iterable[str] = (),
    ) -> BaseModel:
        """``units``: the unit kind and text of each option written with a unit (from a .plan);
        ``unitless``: the options a .plan wrote as a bare number. A number in neither (plan.json)
        is in base units."""
        model = self.options_model
        fields = list(model.model_fields)
        base = ("uses", index if index is not None else 0, "options")
        written: dict[str, tuple[str | None, str | None]] = {key: (None, None) for key in unitless}
        written.update(units or {})
        issues: list[SpecIssue] = []
        for key in raw:
            if key not in fields:
                if not fields:
                    hint = f"strategy '{self.name}' takes no options; remove them"
                else:
                    hint = did_you_mean(key, fields) or f"'{self.name}' takes {one_of(fields)}"
                issues.append(SpecIssue(base + (key,), f"unknown option '{key}' for strategy '{self.name}'", hint))
            elif key in written:
                field = model.model_fields[key]
                kind = unit_kind_of(field)
                problem = unit_mismatch(
                    f"option '{key}' of strategy '{self.name}'", kind, *written[key], _default_literal(field, kind)
                )
                if problem:
                    issues.append(SpecIssue(base + (key,), *problem))
        if issues:
            raise SpecError(issues)
        try:
            # Strict, as the core keys are: true is not a number, "7" is not a count and 3.0 is not
            # a whole one. pydantic's lax mode would quietly make them 1, 7 and 3 -- and a plugin's
            # author should not have to ask for strictness to get the language's rules.
            return model.model_validate(raw, strict=True, context=context)
        except ValidationError as exc:
            by_option: dict[str | None, list[ErrorDetails]] = {}
            for err in exc.errors():
                by_option.setdefault(str(err["loc"][0]) if err["loc"] else None, []).append(err)
            for loc, errors in by_option.items():
                issues.append(self._option_issue(base, loc, raw, errors, (units or {}).get(loc or "")))
            raise SpecError(issues) from None

    def _option_issue(
        self,
        base: tuple[str | int, ...],
        loc: str | None,
        raw: dict[str, Any],
        errors: list[ErrorDetails],
        unit: tuple[str, str] | None,
    ) -> SpecIssue:
        """One option's validation errors, worded as the core language words a bad key's
        (:func:`planc.spec.build.describe_invalid`), with the option's doc as the hint."""
        model = self.options_model
        if loc is None or loc not in model.model_fields:
            return SpecIssue(base, f"the options of strategy '{self.name}': {errors[0]['msg']}")
        field = model.model_fields[loc]
        value = raw.get(loc)
        if any(e["type"] == "missing" for e in errors):
            required = (field.description or "required").splitlines()[0]
            return SpecIssue(
                base[:2], f"use {self.name} is missing the option '{loc}'", f"add {loc} = ...  ({required})"
            )
        shown = Quantity(value, cast(QuantityKind, unit[0]), unit[1]) if unit and isinstance(value, float) else value
        doc = field.description.splitlines()[0] if field.description else None
        hint = invalid_hint(value, errors)
        return SpecIssue(
            base + (loc,),
            describe_invalid(f"option '{loc}' of strategy '{self.name}'", shown, errors, field),
            f"{hint} ({doc})" if hint and doc else hint or doc,
        )


def _default_literal(field: FieldInfo, kind: str | None) -> str | None:
    """``25 MB (the default)``: an option's default in its unit, the example a unit error
    suggests; None when it has no number for a default (required, or from the layout)."""
    default = None if field.is_required() else field.get_default(call_default_factory=True)
    if kind is None or not is_bare_number(default):
        return None
    return f"{format_literal(default, kind)} (the default)"


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
    for attr in ("apply", "enabled", "check", "cost", "steady_after"):
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


def unwritable_options(module: types.ModuleType) -> list[str]:
    """A message for each field of the module's ``Options`` that no ``.plan`` value can fill: a use
    block holds numbers, quantities, true/false, words, strings and lists of those -- no mapping,
    set, tuple, enum member or null -- and a plugin's author should hear so from ``planc plugins``,
    not from a user's "Input should be a valid dictionary"."""
    options = getattr(module, "Options", None)
    if not (isinstance(options, type) and issubclass(options, BaseModel)):
        return []
    return [
        f"option '{name}' has the type {_type_text(field.annotation)}, which no value in a .plan can have "
        "(a use block holds numbers, quantities, true/false, words, strings and lists of them); "
        "give it one of those types"
        for name, field in options.model_fields.items()
        if not _writable(field.annotation)
    ]


def _writable(annotation: Any) -> bool:
    """Whether a .plan value can fill a field of this type (validated strictly, as planc does)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in (bool, int, float, str, Any):
        return True
    if origin is typing.Literal:
        return all(isinstance(a, (bool, int, float, str)) for a in args)
    if origin is typing.Annotated:
        return _writable(args[0])
    if origin is list:
        return not args or _writable(args[0])
    if origin is typing.Union or isinstance(annotation, types.UnionType):
        return any(_writable(a) for a in args if a is not type(None))
    return False


def _type_text(annotation: Any) -> str:
    """``dict[str, int]``, ``set``: the type as its author wrote it."""
    if typing.get_args(annotation):
        return str(annotation).replace("typing.", "")
    return str(getattr(annotation, "__name__", annotation))


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
