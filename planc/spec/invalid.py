"""How a bad value of a key is worded: ``layers must be a whole number, got 24.0``, with a hint
(``leave out the decimal point: 24``).

One wording for the core keys (:mod:`planc.spec.build`) and for a ``use`` block's options
(:mod:`planc.strategies.contract`), from pydantic's error details, so a plugin's option is
refused in the language's words, not pydantic's.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic_core import ErrorDetails

from planc.errors import did_you_mean, one_of
from planc.units import Quantity


def describe_invalid(key: str, value: Any, errors: list[ErrorDetails], field: object) -> str:
    shown = value.text if isinstance(value, Quantity) else _show(value)
    # For "int | auto" unions pydantic reports one error per branch; the non-auto one says more.
    informative = [e for e in errors if "literal_error" != e["type"] or "'auto'" not in e["msg"]] or errors
    err = informative[0]
    kind = err["type"]
    accepts_auto = any("'auto'" in e["msg"] for e in errors if e["type"] == "literal_error")
    suffix = " (or auto)" if accepts_auto else ""
    if kind == "literal_error":
        return f"{key} = {shown} is not a valid choice: expected {err['ctx']['expected']}{suffix}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        ((op, bound),) = ((k, v) for k, v in err["ctx"].items())
        words = {"gt": "greater than", "ge": "at least", "lt": "less than", "le": "at most"}[op]
        return f"{key} must be {words} {_show(bound)}{suffix}, got {shown}"
    if kind in ("int_type", "int_from_float", "int_parsing"):
        if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
            shown = repr(value)  # "layers must be a whole number, got 1" would puzzle: show the 1.0
        return f"{key} must be a whole number{suffix}, got {shown}"
    if kind == "finite_number":
        return f"{key} must be a finite number, got {shown}"
    if kind in ("bool_type", "bool_parsing"):
        return f"{key} must be true or false{suffix}, got {shown}"
    if kind in ("float_type", "float_parsing"):
        return f"{key} must be a number, got {shown}"
    if kind in ("string_type",):
        return f'{key} must be a string in quotes, e.g. "...", got {shown}'
    if kind == "value_error":
        return f"{key}: {err['msg'].removeprefix('Value error, ')}"
    return f"{key} = {shown} is not valid: {err['msg']}"


def invalid_hint(value: Any, errors: list[ErrorDetails]) -> str | None:
    if any(err["type"].startswith("bool") for err in errors):
        return "write true or false" + (" (or auto)" if any("'auto'" in e["msg"] for e in errors) else "")
    if isinstance(value, float) and value.is_integer() and any(err["type"].startswith("int") for err in errors):
        return f"leave out the decimal point: {int(value)}"
    if not isinstance(value, str):
        return None
    for err in errors:
        if err["type"] == "literal_error":
            choices = [c.strip().strip("'") for c in err["ctx"]["expected"].replace(" or ", ", ").split(",")]
            if value in choices:  # "1" where the choice is the number 1
                return f"write it without quotes: {value}"
            return did_you_mean(str(value), choices) or one_of(choices)
    return None


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # a bare word (gelu, 1f1b) as written; text that is not one, or
        # that would read as a number ("1"), in quotes
        bare = re.fullmatch(r"[A-Za-z0-9_]+(?:-[A-Za-z0-9_]+)*", value) and not re.fullmatch(
            r"[-+]?[0-9_.]+(?:[eE][-+]?[0-9_]+)?", value
        )
        return value if bare else f'"{value}"'
    if isinstance(value, Quantity):
        return value.text or f"{value.value:g}"
    if isinstance(value, list):
        return "[" + ", ".join(_show(item) for item in value) + "]"
    if isinstance(value, int) and abs(value) >= 10**18:  # a typo like 1e30: its 31 digits say nothing
        return f"{float(value):.3g}" if abs(value) < 10**300 else f"a {len(str(abs(value)))}-digit number"
    return (
        repr(value) if not isinstance(value, (int, float)) else f"{value:g}" if isinstance(value, float) else str(value)
    )
