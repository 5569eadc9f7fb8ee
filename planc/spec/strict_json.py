"""JSON with numbers a plan can mean: finite floats, integers below 2**63, no NaN/Infinity.

Python's ``json`` reads ``1e400`` as inf, ``NaN`` and ``Infinity`` as floats, and a 5000-digit
integer as a ValueError from deep inside; a config.json or plan.json holding one is corrupt.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: No size, count or rate in a plan comes near 2**63.
MAX_INT = 2**63


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(int(text)) >= MAX_INT:
        raise ValueError(f"the number {text[:24]}{'...' if len(text) > 24 else ''} is out of range")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:24]} is out of range for a 64-bit float")
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number; JSON here holds finite numbers only")


def loads(text: str) -> Any:
    """``json.loads`` that raises ValueError (JSONDecodeError for syntax) for such numbers."""
    return json.loads(text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant)
