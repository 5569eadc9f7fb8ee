"""Shared field types and the frozen base model of every spec section.

Unit-carrying fields are ``Annotated`` floats/ints tagged with the :class:`UnitKind` they
expect. They accept a :class:`~planc.units.Quantity` of that kind (from a ``.plan`` file) or a
plain number in base units (from ``plan.json``). Whether a ``.plan`` file wrote a unit at all is
checked earlier, in :mod:`planc.spec.build`, where the value's source is still known.
Plugin authors use the same types for their options (``Bytes``, ``Bandwidth``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from planc.units import KIND_DESCRIPTIONS, Quantity, QuantityKind

Auto = Literal["auto"]
AUTO: Auto = "auto"


@dataclass(frozen=True)
class UnitKind:
    """Marks a field as measured in a unit of ``kind`` (bytes, bandwidth, compute, time)."""

    kind: QuantityKind


def _accept_quantity(kind: QuantityKind):
    def convert(value: Any) -> Any:
        if isinstance(value, Quantity):
            if value.kind != kind:
                raise ValueError(
                    f"expects {KIND_DESCRIPTIONS[kind]}, but {value.text or value.value} is "
                    f"{KIND_DESCRIPTIONS[value.kind].split(',')[0]}"
                )
            return value.value
        return value

    return convert


# Field(gt=0), not a validator of our own: its error carries the bound, so a plan is told
# "memory must be greater than 0, got 0 GiB" like every other key.
Bytes = Annotated[float, UnitKind("bytes"), BeforeValidator(_accept_quantity("bytes")), Field(gt=0)]
Bandwidth = Annotated[float, UnitKind("bandwidth"), BeforeValidator(_accept_quantity("bandwidth")), Field(gt=0)]
Compute = Annotated[float, UnitKind("compute"), BeforeValidator(_accept_quantity("compute")), Field(gt=0)]
Seconds = Annotated[float, UnitKind("time"), BeforeValidator(_accept_quantity("time")), Field(ge=0)]

PositiveInt = Annotated[int, Field(gt=0, strict=True)]
NonNegativeInt = Annotated[int, Field(ge=0, strict=True)]
PositiveIntOrAuto = PositiveInt | Auto
#: true or false only: pydantic's lax bool would also take yes/no/on/off/1/0, which the language
#: does not have (a plan says what it means).
Flag = Annotated[bool, Field(strict=True)]


def unit_kind_of(field_info) -> QuantityKind | None:
    """The unit kind a pydantic field expects, or None for a plain value."""
    for meta in field_info.metadata:
        if isinstance(meta, UnitKind):
            return meta.kind
    for arg in get_args(field_info.annotation):  # an optional quantity: Bandwidth | None
        for meta in getattr(arg, "__metadata__", ()):
            if isinstance(meta, UnitKind):
                return meta.kind
    return None


class SpecModel(BaseModel):
    """Base of every spec section: frozen, strict about unknown keys, documented fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)
