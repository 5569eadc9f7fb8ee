"""Safe spelling of data inside emitted Python source.

The emitted program never pastes user text into code. Values go in as Python literals built by
:func:`python_literal` (``repr`` of plain JSON-like data, which escapes quotes, newlines and
everything else), and the little user text that appears in docstrings or comments passes through
:func:`inert_text`, which leaves no quote, backslash sequence or line break that could end the
docstring or comment.
"""

from __future__ import annotations

import json
import math
import pprint
from typing import Any


def python_literal(value: Any, *, width: int = 96, indent: int = 0) -> str:
    """A Python expression that evaluates to ``value`` (JSON-like data only), pretty-printed.

    Raises ``TypeError`` for anything that is not None/bool/int/float/str/list/tuple/dict with
    string keys, so a surprising object can never smuggle its ``__repr__`` into the program.
    """
    _check_plain(value)
    text = pprint.pformat(value, width=width - indent, sort_dicts=False)
    return text.replace("\n", "\n" + " " * indent)


def _check_plain(value: Any) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"cannot emit the non-finite number {value!r}")
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_plain(item)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"cannot emit a dict key of type {type(key).__name__}")
            _check_plain(item)
        return
    raise TypeError(f"cannot emit a value of type {type(value).__name__}")


def keyword_arguments(values: dict[str, Any]) -> str:
    """``a=1, b='x'`` for option values; keys must be plain identifiers (pydantic field names)."""
    parts = []
    for key, value in values.items():
        if not key.isidentifier() or key.startswith("__"):
            raise ValueError(f"option name {key!r} is not a plain identifier")
        parts.append(f"{key}={python_literal(value, width=10**6)}")
    return ", ".join(parts)


def inert_text(text: str, limit: int = 120) -> str:
    """``text`` made safe for a docstring or ``#`` comment: one line, ASCII, no quotes or backslashes.

    JSON escaping turns line breaks, control characters and non-ASCII into ``\\n``/``\\uXXXX``; the
    backslashes and double quotes it leaves are then replaced, so nothing can close a ``\"\"\"`` or
    start a new line of code.
    """
    escaped = json.dumps(str(text), ensure_ascii=True)[1:-1]
    escaped = escaped.replace("\\", "/").replace('"', "'")
    return escaped if len(escaped) <= limit else escaped[: limit - 3] + "..."


def identifier_for(name: str, taken: set[str]) -> str:
    """A Python variable name for a strategy called ``name`` (its own name when that is safe)."""
    import keyword

    base = name if name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_") else "strategy"
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}_{n}"
    taken.add(candidate)
    return candidate
