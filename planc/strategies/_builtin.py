"""Helpers shared by the built-in strategies' plan-time faces (no torch here)."""

from __future__ import annotations

import importlib

from pydantic import BaseModel, ConfigDict

#: The composition order of the built-ins, outermost transformation first (each one's AFTER says
#: the same thing edge by edge; tests check that the sort reproduces this list).
#: Pipeline parallelism splits the model into stages, so everything after it runs per stage;
#: tensor parallelism addresses modules by name, so it comes before anything that wraps them;
#: recomputation wraps whole (already sharded) blocks; precision hands FSDP its policy, which
#: FSDP2 only takes when it wraps; data parallelism (DDP / ZeRO / FSDP) comes last.
BUILTIN_ORDER = ("pipeline", "tensor_parallel", "recompute", "bf16", "ddp", "zero1", "fsdp")


def after(name: str) -> tuple[str, ...]:
    """The built-ins that come before ``name`` (its AFTER)."""
    order = BUILTIN_ORDER[: BUILTIN_ORDER.index(name)]
    if name in ("zero1", "fsdp"):  # the three data-parallel strategies exclude each other
        order = tuple(n for n in order if n not in ("ddp", "zero1"))
    return order


class StrategyOptions(BaseModel):
    """Base of the built-ins' Options: frozen, unknown keys rejected, each field documented."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


def builtin_cost(name: str, ctx, estimate, options):
    """The cost model's pass for built-in strategy ``name`` (``planc.cost.builtin.<name>``).

    Until the cost model is installed this is the identity (the estimate is returned unchanged).
    """
    try:
        builtin = importlib.import_module("planc.cost.builtin")
    except ModuleNotFoundError as exc:
        if exc.name not in ("planc.cost", "planc.cost.builtin"):
            raise
        return estimate
    return getattr(builtin, name)(ctx, estimate, options)
