"""Find, check and order the strategy plugins registered under the ``planc.strategies`` entry points.

Built-in strategies come through the same door as third-party ones: ``planc``'s own
``pyproject.toml`` registers them. The loader checks every module against the contract
(:mod:`planc.strategies.contract`); a module that fails to import, declares another API version,
lacks a required attribute, carries a misspelled hook, or takes a name that is already taken is
recorded as a :class:`PluginProblem` (naming its distribution and version) and skipped. planc
keeps working.

The core, not a plugin, decides name collisions: a built-in (distribution ``planc``) always keeps
its name; two third-party plugins that claim the same name are both skipped.

``PLANC_PLUGINS=a,b`` restricts loading to those names (built-ins included).

The registry is loaded once, at the top -- by a ``planc`` command, or by an emitted program that
uses a third-party strategy -- and handed down: the ``.plan`` reader validates ``use`` blocks
with it, the planner asks it for each layout's cost passes (:meth:`Registry.passes`) and
refusals, the code generator for the strategies to emit, ``compose`` for the ones to apply.
Nothing below the commands loads it on its own.

Importing this module, and loading the registry, never imports torch: plugins keep torch out of
their plan-time face (the contract), and this loader only imports the modules.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata as metadata
import os
import sys
import threading
import types
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import networkx as nx

from planc import stages
from planc.cost.estimate import CostPass, Passes
from planc.errors import PlanError, debug_traceback, did_you_mean, one_of
from planc.spec.build import unknown_strategy_hint
from planc.spec.issues import SpecError, SpecIssue
from planc.stages import StageStyle
from planc.strategies import api
from planc.strategies.composition import BUILTIN_ORDER, composition_graph
from planc.strategies.conflicts import drop_cycles, settle_collision
from planc.strategies.contract import (
    LoadedStrategy,
    PluginError,
    PluginProblem,
    contract_problems,
    raised_at,
    unwritable_options,
    use_index,
)

if TYPE_CHECKING:
    from planc.spec.layout import Layout
    from planc.spec.plan import Plan

#: What an emitted program says to do about a registered strategy that was skipped while loading.
_UNLOADED_HINT = (
    "fix or reinstall the plugin (`planc plugins` lists every problem), or remove its use block from the plan "
    "and compile it again"
)

#: How many layouts' passes a registry remembers (the planner asks for thousands per plan).
_PASSES_MEMO_LIMIT = 4096


class Registry:
    """Every registered strategy by name, and every problem found while loading.

    The names come from the installed distributions' metadata when the registry is made; the
    modules are imported the first time a strategy is asked for (:attr:`strategies`), so a
    command that needs only the names -- ``planc check`` of a plan without ``use`` blocks --
    imports no strategy at all.
    """

    def __init__(
        self,
        registered: frozenset[str] = frozenset(),
        load_modules: Callable[[Registry], None] | None = None,
    ) -> None:
        self.registered = registered
        """Every name an installed distribution registers (after ``PLANC_PLUGINS``), loaded or
        not: the names a ``use`` block may refer to."""
        self._strategies: dict[str, LoadedStrategy] = {}
        self._problems: list[PluginProblem] = []
        self._load_modules = load_modules
        self._lock = threading.RLock()
        self._order: list[LoadedStrategy] = []
        self._order_key: tuple[tuple[str, tuple[str, ...]], ...] | None = None
        self._passes: dict[tuple[int, tuple[object, ...]], tuple[Plan, Passes]] = {}

    def _loaded(self) -> Registry:
        with self._lock:
            if self._load_modules is not None:
                load, self._load_modules = self._load_modules, None
                load(self)
        return self

    @property
    def strategies(self) -> dict[str, LoadedStrategy]:
        """Every strategy that loaded and met the contract, by name."""
        return self._loaded()._strategies

    @property
    def problems(self) -> list[PluginProblem]:
        """Every problem found while loading (skipped plugins, warnings)."""
        return self._loaded()._problems

    def __contains__(self, name: str) -> bool:
        return name in self.strategies

    def __getitem__(self, name: str) -> LoadedStrategy:
        try:
            return self.strategies[name]
        except KeyError:
            raise self.missing(name) from None

    def missing(self, name: str) -> PlanError:
        """Why ``name`` is not a loaded strategy: the problem that made the registry skip it (a
        name clash, a failed import, ...) when a distribution registers it, else that none does."""
        problem = self.skipped_problem(name)
        if problem is not None:
            return PlanError(
                f"strategy plugin '{name}' (from {problem.distribution} {problem.version}) is installed but "
                f"was not loaded: {problem.message}",
                hint=_UNLOADED_HINT,
            )
        return PlanError(f"no strategy named '{name}' is installed", hint=unknown_strategy_hint(name, self.strategies))

    def skipped_problem(self, name: str) -> PluginProblem | None:
        """The first problem that made the registry skip a strategy registered as ``name``."""
        return next((p for p in self.problems if p.name == name and p.skipped), None)

    def notices(self) -> list[PluginProblem]:
        """The problems every planning command shows, not only ``planc plugins``: they change what a
        plan costs or which strategies take part in it (a plugin that imports torch at plan time,
        one skipped because its ``enabled`` failed). Empty while no plugin module is imported."""
        if self._load_modules is not None:
            return []
        return [p for p in self._problems if p.notice]

    def active(self, plan: Plan, layout: Layout) -> list[LoadedStrategy]:
        """The strategies taking part in ``layout``, in composition order.

        Each strategy's ``AFTER`` is an edge of a networkx DiGraph over all loaded strategies; its
        topological sort (ties broken by name, so the order is stable) is computed once, and the
        active strategies are taken in that order -- a sub-sequence of a topological order is a
        topological order of the sub-graph, and the planner asks this for thousands of layouts.
        """
        return [s for s in self.order() if self._takes_part(s, plan, layout)]

    def steady_after(self, plan: Plan, layout: Layout) -> dict[str, int]:
        """Active strategies that run steps before working as priced (``steady_after``), with those steps."""
        found = {s.name: s.steady_after(plan, s.options_for(plan, layout)) for s in self.active(plan, layout)}
        return {name: steps for name, steps in found.items() if steps > 0}

    def _takes_part(self, strategy: LoadedStrategy, plan: Plan, layout: Layout) -> bool:
        """``strategy.enabled``; a third-party ``enabled`` that raises is the plugin's problem, not
        the plan's: for a plan that does not name it the plugin is skipped (from now on, as a
        plugin that fails to load is) and the problem recorded as a notice; a plan that names it
        gets the error."""
        try:
            return strategy.enabled(plan, layout)
        except PluginError as error:
            if strategy.use_index(plan) is not None:
                raise
            with self._lock:
                if self._strategies.pop(strategy.name, None) is not None:
                    self._passes.clear()
                    self._problems.append(
                        PluginProblem(
                            strategy.name,
                            strategy.distribution,
                            strategy.version,
                            f"{error.detail}; it is left out of every plan that does not name it "
                            "(report it to the plugin's authors)",
                            notice=True,
                        )
                    )
            return False

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

    def validate_uses(self, plan: Plan, layout: Layout | None = None) -> list[SpecIssue]:
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
        problem = self.skipped_problem(name)
        if problem is None:
            return []
        return [
            SpecIssue(
                ("uses", index, "name"),
                f"strategy plugin '{name}' is installed but was not loaded: {problem.message}",
                "fix or reinstall the plugin, or remove this use block (`planc plugins` lists every problem)",
            )
        ]

    def missing_builtins(self, plan: Plan, layout: Layout) -> list[SpecIssue]:
        """The built-ins ``layout`` needs that are not loaded (``PLANC_PLUGINS`` left them out): without
        them the program would silently lack a part of the layout."""
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

    def refusal(self, plan: Plan, layout: Layout) -> str | None:
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

    def check(self, plan: Plan, layout: Layout) -> list[SpecIssue]:
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
                        unknown_strategy_hint(use.name, self.strategies),
                    )
                ]
        issues += self.missing_builtins(plan, layout)
        try:
            active = self.active(plan, layout)
        except PlanError as error:
            return issues + [SpecIssue(self.path_of(plan, error), error.message, error.hint)]
        for strategy in active:
            try:
                options = strategy.options_for(plan, layout)
            except SpecError as error:
                issues += error.issues
                continue
            try:
                message = strategy.check(plan, layout, options)
            except PluginError as error:
                issues.append(SpecIssue(self.path_of(plan, error), error.message, error.hint))
                continue
            if message:
                block = strategy.use_index(plan)
                path: tuple[str | int, ...] = ("uses", block) if block is not None else ("layout",)
                issues.append(SpecIssue(path, f"{strategy.name}: {message}"))
        return issues

    @staticmethod
    def path_of(plan: Plan, error: PlanError) -> tuple[str | int, ...]:
        """Where in the plan ``error`` belongs: the ``use`` block naming the plugin that raised it."""
        index = use_index(plan, error.strategy) if isinstance(error, PluginError) else None
        return ("uses", index, "name") if index is not None else ("uses",)

    def require(self, plan: Plan, layout: Layout) -> None:
        """Raise a PlanError with every :meth:`check` problem of ``layout`` (what compile and explain
        refuse)."""
        issues = self.check(plan, layout)
        if issues:
            raise PlanError(
                "; ".join(issue.message for issue in issues), hint=next((i.hint for i in issues if i.hint), None)
            )

    def unused_uses(self, plan: Plan, layout: Layout) -> list[str]:
        """Warnings for ``use`` blocks of strategies that do not take part in ``layout`` (their options
        have no effect; with an ``auto`` layout that is the planner's choice, not a mistake)."""
        active = {s.name for s in self.active(plan, layout)}
        return [
            f"use {use.name}: '{use.name}' does not take part in the layout {layout.describe()}, "
            "so its options have no effect"
            for use in plan.uses
            if use.name in self.strategies and use.name not in active
        ]

    # -- what the cost model runs ---------------------------------------------------------------

    def passes(self, plan: Plan, layout: Layout) -> Passes:
        """The cost passes of the strategies active in ``layout``, in composition order, with their
        options and where they put the pipeline stages.

        Which strategies are active (and their options) does not depend on the micro-batch size,
        so the answer is remembered per plan object and layout without its micro-batch.
        """
        key = (id(plan), _layout_key(layout))
        hit = self._passes.get(key)
        if hit is not None and hit[0] is plan:
            return hit[1]
        active = self.active(plan, layout)
        steps = tuple(CostPass(s.name, s.cost, s.options_for(plan, layout)) for s in active)
        found = Passes(steps, self._stage_style(layout, steps))
        if len(self._passes) >= _PASSES_MEMO_LIMIT:
            self._passes.clear()
        self._passes[key] = (plan, found)
        return found

    @staticmethod
    def _stage_style(layout: Layout, steps: tuple[CostPass, ...]) -> StageStyle:
        """Where the stages sit: the built-in ``pipeline`` decides (a plugin cannot take its name),
        from its ``zero_bubble`` option (:func:`planc.stages.stage_style`)."""
        for step in steps:
            if step.name == "pipeline":
                return stages.stage_style(layout.schedule, getattr(step.options, "zero_bubble", "interleaved"))
        return "looped"


def _layout_key(layout: Layout) -> tuple[object, ...]:
    return (
        layout.tp,
        layout.pp,
        layout.dp,
        layout.zero,
        layout.recompute,
        layout.schedule,
        layout.virtual_stages,
        layout.sequence_parallel,
        layout.shard_group,
    )


# -- loading ------------------------------------------------------------------------------------

_cache: dict[tuple[str, ...] | None, Registry] = {}
_lock = threading.Lock()


def load_strategy(name: str) -> LoadedStrategy:
    """The installed strategy ``name``, for an emitted program. When it cannot be had (not
    installed, skipped for a name clash, failed to import) the program prints why, as planc prints
    any error, and exits 1: whoever runs it gets the registry's reason, not a traceback."""
    try:
        return load_registry()[name]
    except PlanError as error:
        print(str(error), file=sys.stderr)
        raise SystemExit(1) from None


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


def _dist_of(entry_point: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(entry_point, "dist", None)
    if dist is None:
        return "<unknown distribution>", "?"
    return dist.metadata["Name"] or dist.name, dist.version


def _load(restrict: set[str] | None) -> Registry:
    """The registry of the installed entry points (restricted to ``restrict``); their modules are
    imported when first needed (:func:`_import_strategies`)."""
    entry_points = list(metadata.entry_points(group=api.ENTRY_POINT_GROUP))
    registered_names = {ep.name for ep in entry_points}
    unknown: list[PluginProblem] = []
    if restrict is not None:
        for name in sorted(restrict - registered_names):
            unknown.append(
                PluginProblem(
                    name,
                    "PLANC_PLUGINS",
                    "",
                    f"no installed distribution registers a strategy named '{name}'; "
                    + (did_you_mean(name, registered_names) or one_of(sorted(registered_names))),
                )
            )
        entry_points = [ep for ep in entry_points if ep.name in restrict]
    return Registry(
        frozenset(ep.name for ep in entry_points),
        functools.partial(_import_strategies, entry_points, registered_names, unknown),
    )


def _import_strategies(
    entry_points: list[metadata.EntryPoint],
    registered_names: set[str],
    unknown: list[PluginProblem],
    registry: Registry,
) -> None:
    """Import each entry point's module, check it against the contract, settle name collisions
    and ordering cycles; fill ``registry`` with what passed and with every problem."""
    problems, strategies = registry.problems, registry.strategies
    problems += unknown
    candidates: dict[str, list[LoadedStrategy]] = {}
    for ep in entry_points:
        distribution, version = _dist_of(ep)
        problem = functools.partial(PluginProblem, ep.name, distribution, version)
        had_torch = "torch" in sys.modules
        try:
            module = ep.load()
        except Exception as exc:  # a broken plugin must not take planc down
            debug_traceback(exc)
            where = raised_at(exc, ep.module)
            problems.append(
                problem(f"import of '{ep.value}' failed{f' at {where}' if where else ''}: {type(exc).__name__}: {exc}")
            )
            continue
        if not had_torch and "torch" in sys.modules:
            problems.append(problem(_TORCH_AT_PLAN_TIME.format(module=ep.value), skipped=False, notice=True))
        if not isinstance(module, types.ModuleType):
            problems.append(
                problem(
                    f"'{ep.value}' is a {type(module).__name__}, but a strategy entry "
                    'point must name a module (e.g. "my_package.strategy")'
                )
            )
            continue
        messages = contract_problems(ep.name, module)
        if messages:
            problems += [problem(m) for m in messages]
            continue
        problems += [problem(m, skipped=False) for m in unwritable_options(module)]
        candidates.setdefault(ep.name, []).append(LoadedStrategy(ep.name, module, distribution, version))

    for name, claims in sorted(candidates.items()):
        strategies.update(settle_collision(name, claims, problems))

    drop_cycles(registry, registered_names)


#: A plugin whose plan-time module imports torch: planc can use it, but every plan pays for it.
_TORCH_AT_PLAN_TIME = (
    "importing '{module}' imported torch, which planning never needs: every `planc check`, `explain` "
    "and `compile` of a plan with a use block now waits seconds for torch to load; import torch "
    'inside apply() or in the run-time module only (docs/plugins.md, "two faces")'
)
