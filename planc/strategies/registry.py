"""Find, check and order the strategy plugins registered under the ``planc.strategies`` entry points.

Built-in strategies come through the same door as third-party ones: ``planc``'s own
``pyproject.toml`` registers them. The loader checks every module against the contract in
:mod:`planc.strategies.api`; a module that fails to import, declares another API version, lacks a
required attribute, carries a misspelled hook, or takes a name that is already taken is recorded
as a :class:`PluginProblem` (naming its distribution and version) and skipped. planc keeps working.

The core, not a plugin, decides name collisions: a built-in (distribution ``planc``) always keeps
its name; two third-party plugins that claim the same name are both skipped.

``PLANC_PLUGINS=a,b`` restricts loading to those names (built-ins included).

Importing this module, and loading the registry, never imports torch: plugins keep torch out of
their plan-time face (the contract), and this loader only imports the modules.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata as metadata
import os
import threading
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
from pydantic import BaseModel, ValidationError

from planc.errors import PlanError, did_you_mean, one_of
from planc.spec.build import unit_mismatch
from planc.spec.fields import unit_kind_of
from planc.spec.issues import SpecError, SpecIssue
from planc.strategies import api
from planc.strategies.composition import BUILTIN_ORDER

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
        return getattr(self.module, "Options", _NoOptions)

    @property
    def after(self) -> tuple[str, ...]:
        """Strategies that must be applied before this one when both are active."""
        return tuple(getattr(self.module, "AFTER", ()))

    def enabled(self, plan, layout) -> bool:
        """Whether the strategy takes part: the module's own rule, else "the plan names it in a use block"."""
        rule = getattr(self.module, "enabled", None)
        if rule is None:
            return any(use.name == self.name for use in plan.uses)
        return bool(self._call("enabled", rule, plan, layout))

    def check(self, plan, layout, options) -> str | None:
        """None when the strategy can apply, else the module's message saying why not."""
        rule = getattr(self.module, "check", None)
        return self._call("check", rule, plan, layout, options) if rule is not None else None

    def cost(self, ctx, estimate, options):
        """The module's pure cost pass; the identity when it declares none."""
        rule = getattr(self.module, "cost", None)
        return self._call("cost", rule, ctx, estimate, options) if rule is not None else estimate

    def _call(self, hook: str, function, *args):
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

    def apply(self, job, options) -> None:
        """Run time: transform ``job`` with PyTorch's own implementation."""
        self.module.apply(job, options)

    def use_index(self, plan) -> int | None:
        """Index of this strategy's ``use`` block in the plan, if it has one."""
        for index, use in enumerate(plan.uses):
            if use.name == self.name:
                return index
        return None

    def options_for(self, plan, layout=None) -> BaseModel:
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
        context: dict | None = None,
        units: dict[str, tuple[str, str]] | None = None,
    ) -> BaseModel:
        """``units``: the unit kind and text of each option written with a unit (from a .plan)."""
        model = self.options_model
        fields = list(model.model_fields)
        base = ("uses", index if index is not None else 0, "options")
        issues = []
        for key in raw:
            if key not in fields:
                if not fields:
                    hint = f"strategy '{self.name}' takes no options; remove them"
                else:
                    hint = did_you_mean(key, fields) or f"'{self.name}' takes {one_of(fields)}"
                issues.append(SpecIssue(base + (key,), f"unknown option '{key}' for strategy '{self.name}'", hint))
            elif key in (units or {}):  # a plain number is taken in base units, as from plan.json
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
                key = err["loc"][0] if err["loc"] else None
                doc = model.model_fields[key].description if key in model.model_fields else None
                issues.append(
                    SpecIssue(
                        base + ((key,) if key is not None else ()),
                        f"option '{key}' of strategy '{self.name}': {err['msg']}",
                        doc.splitlines()[0] if doc else None,
                    )
                )
            raise SpecError(issues) from None


@dataclass
class Registry:
    """Every loaded strategy by name, and every problem found while loading."""

    strategies: dict[str, LoadedStrategy] = field(default_factory=dict)
    problems: list[PluginProblem] = field(default_factory=list)
    _order: list[LoadedStrategy] = field(default_factory=list, repr=False)
    _order_key: tuple | None = field(default=None, repr=False)

    def __contains__(self, name: str) -> bool:
        return name in self.strategies

    def __getitem__(self, name: str) -> LoadedStrategy:
        try:
            return self.strategies[name]
        except KeyError:
            raise PlanError(
                f"no strategy named '{name}' is installed",
                hint=(did_you_mean(name, self.strategies) or "")
                + " (run `planc plugins` to list installed strategies)",
            ) from None

    def active(self, plan, layout) -> list[LoadedStrategy]:
        """The strategies taking part in ``layout``, in composition order.

        Each strategy's ``AFTER`` is an edge of a networkx DiGraph over all loaded strategies; its
        topological sort (ties broken by name, so the order is stable) is computed once, and the
        active strategies are taken in that order -- a sub-sequence of a topological order is a
        topological order of the sub-graph, and the planner asks this for thousands of layouts.
        """
        return [s for s in self.order() if s.enabled(plan, layout)]

    def order(self) -> list[LoadedStrategy]:
        """Every loaded strategy in composition order; a cycle is a PlanError naming it."""
        key = tuple((name, s.after) for name, s in self.strategies.items())
        if self._order_key != key:
            graph = composition_graph(self.strategies.values())
            try:
                names = list(nx.lexicographical_topological_sort(graph))
            except nx.NetworkXUnfeasible:
                cycle = " -> ".join(edge[0] for edge in nx.find_cycle(graph))
                raise PlanError(
                    f"the strategies cannot be ordered: their AFTER declarations form a cycle ({cycle})",
                    hint="remove one of these strategies (or fix the plugin's AFTER)",
                ) from None
            self._order, self._order_key = [self.strategies[n] for n in names], key
        return self._order

    def validate_uses(self, plan, layout=None) -> list[SpecIssue]:
        """Issues with the options of the plan's ``use`` blocks for the strategies that are loaded
        (unknown names are the spec's business; a registered plugin that failed to load is named
        here with its problem); addressed ``("uses", i, "options", key)``."""
        issues: list[SpecIssue] = []
        for index, use in enumerate(plan.uses):
            strategy = self.strategies.get(use.name)
            if strategy is None:
                issues += self._unloaded_use(index, use.name)
                continue
            try:
                strategy.options_for(plan, layout)
            except SpecError as error:
                issues += error.issues
        return issues

    def _unloaded_use(self, index: int, name: str) -> list[SpecIssue]:
        """The issue for ``use NAME`` when NAME is registered but was skipped while loading."""
        problems = [p for p in self.problems if p.name == name and p.skipped]
        if not problems:
            return []
        return [
            SpecIssue(
                ("uses", index, "name"),
                f"strategy plugin '{name}' is installed but was not loaded: {problems[0].message}",
                "fix or reinstall the plugin, or remove this use block (`planc plugins` lists every problem)",
            )
        ]

    def missing_builtins(self, plan, layout) -> list[SpecIssue]:
        """The built-ins ``layout`` needs that are not loaded (``PLANC_PLUGINS`` left them out): without
        them the program would silently lack a part of the layout."""
        import importlib

        needed = []
        for name in BUILTIN_ORDER:
            if name in self.strategies:
                continue
            module = importlib.import_module(f"planc.strategies.{name}")  # plan-time face: no torch
            if module.enabled(plan, layout):
                rule = (module.enabled.__doc__ or "").strip().rstrip(".")
                needed.append((name, rule[:1].lower() + rule[1:]))
        if not needed:
            return []
        shown = " and ".join(f"'{name}' ({rule})" for name, rule in needed)
        names = ",".join(name for name, _ in needed)
        return [
            SpecIssue(
                ("layout",),
                f"the layout {layout.describe()} needs the built-in strateg"
                f"{'ies' if len(needed) > 1 else 'y'} {shown}, which "
                f"{api.RESTRICT_ENV} leaves out",
                f"add {names} to {api.RESTRICT_ENV}, or unset it",
            )
        ]

    def refusal(self, plan, layout) -> str | None:
        """None when every strategy the plan names in a ``use`` block accepts ``layout`` (its own
        ``check``), else the first refusal (``"use powersgd: ..."``): the planner only chooses
        layouts the program can be built for."""
        for use in plan.uses:
            strategy = self.strategies.get(use.name)
            if strategy is not None and strategy.enabled(plan, layout):
                message = strategy.check(plan, layout, strategy.options_for(plan, layout))
                if message:
                    return f"use {use.name}: {message}"
        return None

    def check(self, plan, layout) -> list[SpecIssue]:
        """Problems with the plan's ``use`` blocks and the active strategies, as SpecIssues (empty: all well).

        Covers unknown strategy names, plugins that failed to load, built-ins the layout needs that
        are not loaded, invalid options, and each active strategy's own ``check``.
        """
        issues: list[SpecIssue] = []
        for index, use in enumerate(plan.uses):
            if use.name not in self.strategies:
                issues += self._unloaded_use(index, use.name) or [
                    SpecIssue(
                        ("uses", index, "name"),
                        f"unknown strategy plugin '{use.name}'",
                        (
                            (did_you_mean(use.name, self.strategies) or "") + " (run `planc plugins` to list "
                            "installed strategies)"
                        ).strip(),
                    )
                ]
        issues += self.missing_builtins(plan, layout)
        try:
            active = self.active(plan, layout)
        except PlanError as error:
            return issues + [SpecIssue(("uses",), error.message, error.hint)]
        for strategy in active:
            try:
                options = strategy.options_for(plan, layout)
            except SpecError as error:
                issues += error.issues
                continue
            message = strategy.check(plan, layout, options)
            if message:
                index = strategy.use_index(plan)
                path = ("uses", index) if index is not None else ("layout",)
                issues.append(SpecIssue(path, f"{strategy.name}: {message}"))
        return issues

    def require(self, plan, layout) -> None:
        """Raise a PlanError with every :meth:`check` problem of ``layout`` (what compile and explain
        refuse)."""
        issues = self.check(plan, layout)
        if issues:
            raise PlanError(
                "; ".join(issue.message for issue in issues), hint=next((i.hint for i in issues if i.hint), None)
            )

    def unused_uses(self, plan, layout) -> list[str]:
        """Warnings for ``use`` blocks of strategies that do not take part in ``layout`` (their options
        have no effect; with an ``auto`` layout that is the planner's choice, not a mistake)."""
        active = {s.name for s in self.active(plan, layout)}
        return [
            f"use {use.name}: '{use.name}' does not take part in the layout {layout.describe()}, "
            "so its options have no effect"
            for use in plan.uses
            if use.name in self.strategies and use.name not in active
        ]


def composition_graph(strategies: Iterable[LoadedStrategy]) -> nx.DiGraph:
    """Edge a -> b when b must come after a (b lists a in AFTER); names not among ``strategies`` are ignored."""
    strategies = list(strategies)
    graph = nx.DiGraph()
    graph.add_nodes_from(s.name for s in strategies)
    for strategy in strategies:
        for before in strategy.after:
            if before in graph:
                graph.add_edge(before, strategy.name)
    return graph


# -- loading ------------------------------------------------------------------------------------

_cache: dict[tuple, Registry] = {}
_lock = threading.Lock()


def load_registry(restrict: Iterable[str] | None = None, *, refresh: bool = False) -> Registry:
    """Load every registered strategy (cached per restriction and ``PLANC_PLUGINS``).

    ``restrict`` (or, when it is None, the comma list in ``PLANC_PLUGINS``) limits loading to those
    names; ``refresh=True`` rescans the installed distributions.
    """
    if restrict is None:
        env = os.environ.get(api.RESTRICT_ENV, "").strip()
        restrict = [name.strip() for name in env.split(",") if name.strip()] if env else None
    key = tuple(sorted(restrict)) if restrict is not None else None
    with _lock:
        if refresh or key not in _cache:
            _cache[key] = _load(set(restrict) if restrict is not None else None)
        return _cache[key]


def clear_cache() -> None:
    """Forget loaded registries (tests that install plugins on the fly call this)."""
    with _lock:
        _cache.clear()


def _dist_of(entry_point) -> tuple[str, str]:
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return "<unknown distribution>", "?"
    return dist.metadata["Name"] or dist.name, dist.version


def _load(restrict: set[str] | None) -> Registry:
    registry = Registry()
    entry_points = list(metadata.entry_points(group=api.ENTRY_POINT_GROUP))
    registered_names = {ep.name for ep in entry_points}
    if restrict is not None:
        for name in sorted(restrict - registered_names):
            registry.problems.append(
                PluginProblem(
                    name,
                    "PLANC_PLUGINS",
                    "",
                    f"no installed distribution registers a strategy named '{name}'; "
                    + (did_you_mean(name, registered_names) or one_of(sorted(registered_names))),
                )
            )
        entry_points = [ep for ep in entry_points if ep.name in restrict]

    candidates: dict[str, list[LoadedStrategy]] = {}
    for ep in entry_points:
        distribution, version = _dist_of(ep)
        problem = functools.partial(PluginProblem, ep.name, distribution, version)
        try:
            module = ep.load()
        except Exception as exc:  # a broken plugin must not take planc down
            registry.problems.append(problem(f"import of '{ep.value}' failed: {type(exc).__name__}: {exc}"))
            continue
        if not isinstance(module, types.ModuleType):
            registry.problems.append(
                problem(
                    f"'{ep.value}' is a {type(module).__name__}, but a strategy entry "
                    'point must name a module (e.g. "my_package.strategy")'
                )
            )
            continue
        messages = contract_problems(ep.name, module)
        if messages:
            registry.problems += [problem(m) for m in messages]
            continue
        candidates.setdefault(ep.name, []).append(LoadedStrategy(ep.name, module, distribution, version))

    for name, claims in sorted(candidates.items()):
        registry.strategies.update(_settle_collision(name, claims, registry.problems))

    _drop_cycles(registry, registered_names)
    return registry


def _settle_collision(name: str, claims: list[LoadedStrategy], problems: list[PluginProblem]) -> dict:
    if len(claims) == 1:
        return {name: claims[0]}
    builtins = [c for c in claims if c.builtin]
    winner = builtins[0] if builtins else None
    for claim in claims:
        if claim is winner:
            continue
        if winner is not None:
            message = (
                f"the name '{name}' belongs to planc's built-in strategy; this plugin cannot replace it "
                "(rename it, e.g. '{}_{}')".format(claim.distribution.replace("-", "_"), name)
            )
        else:
            others = ", ".join(f"{c.distribution} {c.version}" for c in claims if c is not claim)
            message = (
                f"the name '{name}' is also registered by {others}; planc cannot tell which one "
                "`use` means, so both are skipped (uninstall one, or ask an author to rename it)"
            )
        problems.append(PluginProblem(name, claim.distribution, claim.version, message))
    return {name: winner} if winner is not None else {}


def contract_problems(name: str, module: types.ModuleType) -> list[str]:
    """Why ``module`` does not meet the strategy contract (empty: it does)."""
    messages = []
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


def _iterable(value) -> Iterable:
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


def _drop_cycles(registry: Registry, registered_names: set[str]) -> None:
    """Report unknown AFTER names (a warning) and skip third-party strategies caught in an AFTER cycle."""
    for strategy in registry.strategies.values():
        for before in strategy.after:
            if before not in registered_names:
                registry.problems.append(
                    PluginProblem(
                        strategy.name,
                        strategy.distribution,
                        strategy.version,
                        f"AFTER names '{before}', which no installed distribution registers; that ordering "
                        "constraint is ignored"
                        + (
                            f" ({did_you_mean(before, registered_names)})"
                            if did_you_mean(before, registered_names)
                            else ""
                        ),
                        skipped=False,
                    )
                )
    graph = composition_graph(registry.strategies.values())
    while True:
        try:
            cycle = nx.find_cycle(graph)
        except nx.NetworkXNoCycle:
            return
        names = [edge[0] for edge in cycle]
        path = " -> ".join(names + [names[0]])
        culprits = [n for n in names if not registry.strategies[n].builtin] or names
        for name in culprits:
            strategy = registry.strategies.pop(name)
            graph.remove_node(name)
            registry.problems.append(
                PluginProblem(
                    name,
                    strategy.distribution,
                    strategy.version,
                    f"its AFTER declaration closes an ordering cycle ({path}); fix AFTER so the order is a chain",
                )
            )


def describe_options(model: type[BaseModel]) -> list[dict[str, Any]]:
    """Each option of an Options model: name, type, default, unit and one-line doc (for `planc plugins`)."""
    from planc.spec.fields import unit_kind_of

    rows = []
    for name, info in model.model_fields.items():
        default = info.get_default(call_default_factory=True) if not info.is_required() else None
        rows.append(
            {
                "name": name,
                "type": type_name(info.annotation),
                "unit": unit_kind_of(info),
                "default": default,
                "required": info.is_required(),
                "description": " ".join((info.description or "").split()),
            }
        )
    return rows


def type_name(annotation: Any) -> str:
    """``bool``, ``'full' | 'selective'``, ``int``: how a .plan writes values of this type (an
    optional option is simply left out: a .plan has no null, so ``None`` is not listed)."""
    import typing

    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) if isinstance(a, str) else str(a).lower() for a in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if args and (origin is typing.Union or type(annotation).__name__ == "UnionType"):
        return " | ".join(type_name(a) for a in args if a is not type(None))
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
