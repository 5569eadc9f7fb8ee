"""Helpers shared by the built-in strategies' plan-time faces (no torch here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, model_validator

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
    """Base of the built-ins' Options: frozen, unknown keys rejected, each field documented.

    Fields named in ``FROM_LAYOUT`` default to None ("as the layout says"); validated with a
    ``{"layout": layout}`` context (what :meth:`LoadedStrategy.options_for` passes when it knows
    the layout), they are filled in from it, so an emitted program spells out the actual values.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    #: field name -> how the layout determines it.
    FROM_LAYOUT: ClassVar[dict[str, Callable[[Any], Any]]] = {}

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
