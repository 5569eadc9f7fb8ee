"""The strategy plugin contract (API version 1).

A strategy is a Python **module** registered under the entry-point group ``planc.strategies``::

    [project.entry-points."planc.strategies"]
    powersgd = "planc_powersgd.strategy"

The module has two faces. The plan-time face must import without torch (planning never imports
it); the run-time face imports torch inside ``apply``.

Required module attributes
--------------------------
``NAME: str``
    The registered name (what ``use NAME { ... }`` and ``planc plugins`` show). Must equal the
    entry-point name.
``API_VERSION: int``
    The version of this contract the module implements; must equal :data:`API_VERSION`.
``DESCRIPTION: str``
    One line for ``planc plugins``.
``apply(job, options) -> None``
    Run time: transform ``job`` (model parts, optimizer factory, step hooks; see
    :class:`planc.runtime.job.Job`) using PyTorch's own implementation.

Optional module attributes
--------------------------
``Options: type[pydantic.BaseModel]``
    Typed options, validated from the ``use`` block (default: no options allowed). Validation
    runs with the pydantic context ``{"plan": plan, "layout": layout}`` (layout None before
    planning), so a validator may fill layout-dependent defaults.
``AFTER: tuple[str, ...]``
    Strategies that must be applied before this one when both are active. planc sorts the
    active strategies topologically (networkx); a cycle or an unknown name is reported.
``enabled(plan, layout) -> bool``
    Whether this strategy takes part in ``layout``. Default: the plan names it in a ``use`` block.
    Built-ins decide from the layout (``ddp``: dp > 1 and zero == 0).
``check(plan, layout, options) -> str | None``
    ``None`` when the strategy can apply to this plan and layout, else a message saying why not
    and what to do.
``cost(ctx, estimate, options) -> estimate``
    Plan time, pure: return ``estimate`` with this strategy's memory / compute / communication
    terms added or changed (see :mod:`planc.cost`). Called in composition order.

Attributes the loader does not know (``aply``, ``Option``) are reported with the nearest known
name, so a misspelled hook is never silently ignored.
"""

from __future__ import annotations

#: The contract version this planc implements. A plugin declaring another version is skipped
#: with a message naming its distribution.
API_VERSION = 1

REQUIRED_ATTRIBUTES = ("NAME", "API_VERSION", "DESCRIPTION", "apply")
OPTIONAL_ATTRIBUTES = ("Options", "AFTER", "enabled", "check", "cost")
ENTRY_POINT_GROUP = "planc.strategies"
#: Comma-separated strategy names; when set, only these (and nothing else) are loaded.
RESTRICT_ENV = "PLANC_PLUGINS"
