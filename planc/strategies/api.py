"""The strategy plugin contract (API version 1), typed.

A strategy is a Python **module** (a package's ``__init__`` counts) registered under the
entry-point group ``planc.strategies``::

    [project.entry-points."planc.strategies"]
    powersgd = "planc_powersgd.strategy"

The module has two faces, each a :class:`typing.Protocol` below that mypy checks a module
against (the built-ins are checked in :mod:`planc.strategies.composition`):

- :class:`PlanTimeFace` -- must import without torch (planning never imports it): ``NAME``,
  ``API_VERSION``, ``DESCRIPTION``, ``AFTER``, ``Options``, ``enabled``, ``check``, ``cost``;
- :class:`RunTimeFace` -- ``apply(job, options)``, which imports torch inside itself.

Required module attributes
--------------------------
``NAME: str``
    The registered name (what ``use NAME { ... }`` and ``planc plugins`` show). Must equal the
    entry-point name.
``API_VERSION: int``
    The version of this contract the module implements; must equal :data:`API_VERSION`.
``DESCRIPTION: str``
    One line for ``planc plugins``.
``apply(job: Job, options: Options) -> None``
    Run time: transform ``job`` (model parts, optimizer factory, step hooks; see
    :class:`planc.runtime.job.Job`) using PyTorch's own implementation.

Optional module attributes
--------------------------
``Options: type[pydantic.BaseModel]``
    Typed options, validated from the ``use`` block (default: no options allowed). Validation
    runs with the pydantic context ``{"plan": plan, "layout": layout}`` (layout None before
    planning), so a validator may fill layout-dependent defaults (:class:`StrategyOptions`).
``AFTER: tuple[str, ...]``
    Strategies that must be applied before this one when both are active. planc sorts the
    active strategies topologically (networkx); a cycle or an unknown name is reported.
``enabled(plan: Plan, layout: Layout) -> bool``
    Whether this strategy takes part in ``layout``. Default: the plan names it in a ``use`` block.
    Built-ins decide from the layout (``ddp``: dp > 1 and zero == 0).
``check(plan: Plan, layout: Layout, options: Options) -> str | None``
    ``None`` when the strategy can apply to this plan and layout, else a message saying why not
    and what to do.
``cost(ctx: CostContext, estimate: Estimate, options: Options) -> Estimate``
    Plan time, pure: return ``estimate`` with this strategy's memory / compute / communication
    terms added or changed (see :mod:`planc.cost`). Called in composition order.
``steady_after(plan: Plan, options: Options) -> int``
    Optimizer steps the strategy runs before it works as its cost pass prices it (default 0:
    from the first step). A gradient compressor that all-reduces uncompressed for its first N
    steps returns N. ``planc verify`` runs that many steps unmeasured before it measures, so that
    it holds the prediction against the steps it describes. No built-in needs it.

Attributes the loader does not know (``aply``, ``Option``) are reported with the nearest known
name, so a misspelled hook is never silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

if TYPE_CHECKING:
    from planc.cost.context import CostContext
    from planc.cost.estimate import Estimate
    from planc.runtime.job import Job
    from planc.spec.layout import Layout
    from planc.spec.plan import Plan

#: The contract version this planc implements. A plugin declaring another version is skipped
#: with a message naming its distribution.
API_VERSION = 1

REQUIRED_ATTRIBUTES = ("NAME", "API_VERSION", "DESCRIPTION", "apply")
OPTIONAL_ATTRIBUTES = ("Options", "AFTER", "enabled", "check", "cost", "steady_after")
ENTRY_POINT_GROUP = "planc.strategies"
#: Comma-separated strategy names; when set, only these (and nothing else) are loaded.
RESTRICT_ENV = "PLANC_PLUGINS"


# -- the two faces ------------------------------------------------------------------------------
# A hook's ``options`` is the strategy's own Options model; the protocols take it as Any, and
# each module annotates it with its own class.


class PlanTimeFace(Protocol):
    """The plan-time face of a strategy module: importable without torch, pure functions only.

    A third-party module may leave out the optional members (the registry supplies the
    defaults); a built-in has them all (``steady_after``, which no built-in needs, is not one of
    them). Hook parameters are positional: name them as you like.
    """

    NAME: str
    API_VERSION: int
    DESCRIPTION: str
    AFTER: tuple[str, ...]

    @property
    def Options(self) -> type[BaseModel]: ...  # noqa: N802  (the contract's name for the class)

    def enabled(self, plan: Plan, layout: Layout, /) -> bool: ...

    def check(self, plan: Plan, layout: Layout, options: Any, /) -> str | None: ...

    def cost(self, ctx: CostContext, estimate: Estimate, options: Any, /) -> Estimate: ...


class RunTimeFace(Protocol):
    """The run-time face: transform the job with PyTorch's own implementation."""

    def apply(self, job: Job, options: Any, /) -> None: ...


class Strategy(PlanTimeFace, RunTimeFace, Protocol):
    """A complete strategy module (every built-in is one)."""


#: The hooks one at a time, as the registry calls them (a plugin's module may define any subset).
EnabledHook = Callable[["Plan", "Layout"], bool]
CheckHook = Callable[["Plan", "Layout", Any], "str | None"]
CostHook = Callable[["CostContext", "Estimate", Any], "Estimate"]
ApplyHook = Callable[["Job", Any], None]
SteadyAfterHook = Callable[["Plan", Any], int]


# -- a base for Options -------------------------------------------------------------------------


class StrategyOptions(BaseModel):
    """A base for a strategy's Options: frozen, unknown keys rejected, each field documented.

    Fields named in ``FROM_LAYOUT`` default to None ("as the layout says"); validated with a
    ``{"layout": layout}`` context (what the registry passes once it knows the layout), they are
    filled in from it, so an emitted program spells out the actual values.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    #: field name -> how the layout determines it.
    FROM_LAYOUT: ClassVar[Mapping[str, Callable[[Layout], object]]] = {}

    @model_validator(mode="before")
    @classmethod
    def _fill_from_layout(cls, data: Any, info: ValidationInfo) -> Any:
        layout = (info.context or {}).get("layout")
        if layout is None or not isinstance(data, dict):
            return data
        filled = dict(data)
        for name, rule in cls.FROM_LAYOUT.items():
            if filled.get(name) is None:
                filled[name] = rule(layout)
        return filled
