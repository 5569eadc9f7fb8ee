"""Reading literal tokens: numbers, bare words, quoted strings and unit quantities.

The grammar's lexer is deliberately loose (one ``ATOM`` terminal for numbers and words, any
word after a number as a unit) so that a malformed literal reaches these functions, which say
precisely what is wrong and where, instead of a generic "unexpected character".
Each function returns the value or raises :class:`LiteralError` with an offset into the token.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from planc.errors import did_you_mean
from planc.units import UNITS


class LiteralError(ValueError):
    """A malformed literal: message, hint, and the span (offset, length) inside the token."""

    def __init__(self, message: str, hint: str | None = None, offset: int = 0, length: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.offset = offset
        self.length = length


#: Digits may be grouped with single underscores between them: 1_000_000.
_DIGITS = r"\d(?:_?\d)*"
NUMBER_RE = re.compile(rf"[-+]?{_DIGITS}(?:\.{_DIGITS})?(?:[eE][-+]?{_DIGITS})?")
#: An enum value or other bare word; may start with a digit (1f1b) and hold hyphens (zero-bubble).
WORD_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_]*(?:-[A-Za-z0-9_]+)*")
#: Beyond this decimal exponent a number is certainly a typo (and would overflow a float).
MAX_EXPONENT = 308


def parse_number(text: str) -> int | float:
    """``"1_000"`` -> 1000, ``"3e-4"`` -> 0.0003, ``"1e3"`` -> 1000 (no '.', integral: an int)."""
    if not NUMBER_RE.fullmatch(text):
        raise LiteralError(f"'{text}' is not a valid number", _number_hint(text), 0, len(text))
    try:
        exact = Decimal(text.replace("_", ""))
    except InvalidOperation:  # pragma: no cover - NUMBER_RE admits only what Decimal reads
        raise LiteralError(f"'{text}' is not a valid number", None, 0, len(text)) from None
    if exact and not -MAX_EXPONENT <= exact.adjusted() < MAX_EXPONENT:
        raise LiteralError(
            f"the number {text} is out of range",
            f"numbers must lie between 1e-{MAX_EXPONENT} and 1e{MAX_EXPONENT} in size",
            0,
            len(text),
        )
    if "." not in text and exact == exact.to_integral_value():
        return int(exact)
    return float(exact)


def _number_hint(text: str) -> str:
    if "__" in text or text.rstrip("0123456789").endswith("_") or "_." in text or "._" in text:
        return "underscores may only stand between two digits, e.g. 1_000_000"
    if text.startswith(".") or text.lstrip("+-").startswith("."):
        return "write a digit before the point, e.g. 0.5"
    if text.endswith("."):
        return "write a digit after the point, e.g. 2.0, or leave the point out"
    return "write a number like 8, 1_024, 0.5, 3e-4 or -2"


def parse_atom(text: str) -> int | float | str:
    """A bare ``ATOM`` token: a number if it looks like one (``1e3``), else a word (``1f1b``)."""
    if NUMBER_RE.fullmatch(text):
        return parse_number(text)
    if _looks_numeric(text.lstrip("+-")):
        return parse_number(text)  # a number with a typo: raises with a number-specific hint
    if WORD_RE.fullmatch(text):
        return text
    if text[:1] in "+-":
        raise LiteralError(
            f"'{text}' is not a number or a word",
            f'a sign can only start a number; write other text in double quotes: "{text}"',
            0,
            len(text),
        )
    bad = next((i for i, ch in enumerate(text) if ch in ".+-"), 0)
    raise LiteralError(f"'{text}' is not a number or a word", f'put text like this in double quotes: "{text}"', bad, 1)


def _looks_numeric(text: str) -> bool:
    """Digits, points, underscores and exponents only: a number with a typo rather than a word."""
    return bool(re.fullmatch(r"[0-9_.]+(?:[eE][-+]?[0-9_.]*)?", text))


_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "n": "\n", "t": "\t", "r": "\r"}
_ESCAPE_RE = re.compile(r"\\(u[0-9A-Fa-f]{4}|.)", re.DOTALL)


def parse_string(raw: str) -> str:
    """Decode a ``STRING`` token (quotes included): ``\\"  \\\\  \\n  \\t  \\r  \\/  \\uXXXX``."""
    inner = raw[1:-1]
    out: list[str] = []
    position = 0
    for match in _ESCAPE_RE.finditer(inner):
        out.append(inner[position : match.start()])
        code = match.group(1)
        if code in _ESCAPES:
            out.append(_ESCAPES[code])
        elif code.startswith("u") and len(code) == 5:
            out.append(chr(int(code[1:], 16)))
        else:
            offset = 1 + match.start()
            hint = (
                'for a backslash write \\\\ (or use / in paths, e.g. "C:/data/train.txt"); '
                'known escapes: \\" \\\\ \\n \\t \\r \\uXXXX'
            )
            raise LiteralError(f"unknown escape sequence '\\{code}' in a string", hint, offset, 1 + len(code))
        position = match.end()
    out.append(inner[position:])
    text = "".join(out)
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        text = _join_surrogates(raw, text)
    if "\0" in text:  # no path or name holds one, and the OS rejects it in file names
        offset = raw.find("\0") if "\0" in raw else raw.lower().find("\\u0000")
        raise LiteralError("a string cannot contain a NUL character", "remove it", max(offset, 0), 1)
    return text


def _join_surrogates(raw: str, text: str) -> str:
    """``\\ud83d\\ude00`` is one character written as a UTF-16 pair (as in JSON); a lone half is no
    character at all and could not be written to a file or a terminal."""
    try:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        found = re.search(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}", raw)
        raise LiteralError(
            "a \\u escape names half of a UTF-16 surrogate pair, which is not a character",
            "write the character itself, or both halves of the pair (e.g. \\ud83d\\ude00)",
            found.start() if found else 0,
            6,
        ) from None


#: Common ways of writing a unit that planc spells differently.
_UNIT_ALIASES_EXACT = {"GBps": "GB/s", "MBps": "MB/s", "TBps": "TB/s", "Gbps": "Gb/s", "Mbps": "Mb/s", "Tbps": "Tb/s"}
_UNIT_ALIASES = {
    "gbps": "Gb/s",
    "mbps": "Mb/s",
    "tbps": "Tb/s",
    "gbytes/s": "GB/s",
    "gbyte/s": "GB/s",
    "tflop": "TFLOPS",
    "tflops/s": "TFLOPS",
    "tflop/s": "TFLOPS",
    "tf": "TFLOPS",
    "tf/s": "TFLOPS",
    "pflop": "PFLOPS",
    "pflop/s": "PFLOPS",
    "gflop": "GFLOPS",
    "gflop/s": "GFLOPS",
    "sec": "s",
    "secs": "s",
    "second": "s",
    "seconds": "s",
    "m": "min",
    "mins": "min",
    "minute": "min",
    "minutes": "min",
    "hr": "h",
    "hrs": "h",
    "hour": "h",
    "hours": "h",
    "msec": "ms",
    "usec": "us",
    "bytes": "B",
    "byte": "B",
    "gigabytes": "GB",
    "gibibytes": "GiB",
}
_UNIT_MEANING = {"bytes": "bytes", "bandwidth": "per second", "compute": "FLOP per second", "time": "time"}


def check_unit(unit: str) -> None:
    """Raise :class:`LiteralError` (offset 0 = the unit) unless ``unit`` is in ``UNITS``."""
    if unit in UNITS:
        return
    raise LiteralError(f"unknown unit '{unit}'", unit_hint(unit), 0, len(unit))


def unit_hint(unit: str) -> str:
    """Suggest the unit meant: same letters in another case, a common alias, or a close spelling."""
    same_letters = [u for u in UNITS if u.lower() == unit.lower()]
    if len(same_letters) == 1:
        return f"did you mean '{same_letters[0]}'? (units are case-sensitive)"
    if len(same_letters) > 1:
        shown = " or ".join(f"'{u}' ({_describe(u)})" for u in sorted(same_letters, key=_case_order))
        return f"did you mean {shown}? (units are case-sensitive)"
    alias = _UNIT_ALIASES_EXACT.get(unit) or _UNIT_ALIASES.get(unit.lower())
    if alias:
        return f"did you mean '{alias}'?"
    close = did_you_mean(unit, UNITS)
    if close:
        return close
    units = "units: B KB MB GB TB, KiB MiB GiB TiB, GB/s Gb/s, TFLOPS PFLOPS, us ms s min h"
    if len(unit) > 1 and "/" not in unit:  # `tp = 8 pp }`: more likely a key that lost its value
        return f"if '{unit}' is the next key, it needs a value: {unit} = ...; {units}"
    return units


def _describe(unit: str) -> str:
    if unit.endswith("b/s"):
        return "bits per second"
    if unit.endswith("B/s"):
        return "bytes per second"
    return _UNIT_MEANING[UNITS[unit][0]]


def _case_order(unit: str) -> tuple[bool, str]:
    return (unit.endswith("b/s"), unit)  # bytes before bits: the usual intent


QUANTITY_SPLIT_RE = re.compile(r"([-+]?[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9_]+)?)([ \t]*)(.*)", re.DOTALL)


def check_quantity_range(number: int | float, unit: str, text: str) -> None:
    """A quantity must be a finite float in base units (80 GiB -> 85899345920.0)."""
    if abs(number) >= 10.0**MAX_EXPONENT / UNITS[unit][1]:
        raise LiteralError(
            f"the quantity {text} is out of range",
            f"a quantity must stay below 1e{MAX_EXPONENT} in base units (bytes, bytes/s, FLOP/s, seconds)",
            0,
            len(text),
        )


def split_quantity(text: str) -> tuple[str, int, str]:
    """``"80 GiB"`` -> ``("80", 3, "GiB")``: the number, the unit's offset, the unit."""
    match = QUANTITY_SPLIT_RE.fullmatch(text)
    if match is None:  # pragma: no cover - the QUANTITY terminal has this shape
        raise LiteralError(f"'{text}' is not a number with a unit", None, 0, len(text))
    number, space, unit = match.groups()
    return number, len(number) + len(space), unit
