"""Unit literals of the ``.plan`` language and the quantities they denote.

A literal such as ``80 GiB`` or ``200 Gb/s`` becomes a :class:`Quantity` holding its value in
base units (bytes, bytes per second, FLOP per second, seconds), its kind, and the text as
written (so ``planc fmt`` keeps ``80 GiB`` rather than ``85899345920``).

Decimal prefixes are powers of 1000 and binary prefixes powers of 1024, as in IEC 80000-13;
``b`` is a bit and ``B`` a byte, so ``200 Gb/s`` = 25 GB/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeGuard

QuantityKind = Literal["bytes", "bandwidth", "compute", "time"]

#: What each kind measures, for error messages ("memory needs bytes, e.g. 80 GiB").
KIND_DESCRIPTIONS: dict[str, str] = {
    "bytes": "a size in bytes, e.g. 80 GiB or 40 GB",
    "bandwidth": "a bandwidth, e.g. 300 GB/s or 200 Gb/s",
    "compute": "a compute rate, e.g. 312 TFLOPS",
    "time": "a time, e.g. 500 ms or 2 h",
}

_DECIMAL = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}


def _build_units() -> dict[str, tuple[QuantityKind, float]]:
    units: dict[str, tuple[QuantityKind, float]] = {}
    for prefix, scale in {**_DECIMAL, **_BINARY}.items():
        units[f"{prefix}B"] = ("bytes", scale)
        units[f"{prefix}B/s"] = ("bandwidth", scale)
    for prefix, scale in _DECIMAL.items():
        if prefix:
            units[f"{prefix}b/s"] = ("bandwidth", scale / 8.0)  # bits per second
    for prefix, scale in {"G": 1e9, "T": 1e12, "P": 1e15}.items():
        units[f"{prefix}FLOPS"] = ("compute", scale)
    units.update(
        {"us": ("time", 1e-6), "ms": ("time", 1e-3), "s": ("time", 1.0), "min": ("time", 60.0), "h": ("time", 3600.0)}
    )
    return units


#: Every unit the language accepts: name -> (kind, size of one unit in base units).
UNITS: dict[str, tuple[QuantityKind, float]] = _build_units()


@dataclass(frozen=True)
class Quantity:
    """A number with a unit, in base units (bytes, B/s, FLOP/s, s)."""

    value: float
    kind: QuantityKind
    text: str = ""

    @classmethod
    def of(cls, number: float, unit: str) -> Quantity:
        """``Quantity.of(80, "GiB")``; raises KeyError for an unknown unit."""
        kind, scale = UNITS[unit]
        text = f"{_format_number(number)} {unit}"
        return cls(value=number * scale, kind=kind, text=text)

    def __str__(self) -> str:
        return self.text or f"{self.value:g} ({self.kind})"


def _format_number(number: float) -> str:
    if float(number).is_integer() and abs(number) < 1e15:
        return str(int(number))
    return repr(float(number))


# -- formatting numbers for people (planc explain, check, plugins, the emitted program) ---------------


def format_bytes(n: float, binary: bool = True) -> str:
    """``85899345920 -> '80.0 GiB'``: a short human size for reports (``binary=False``: 'GB')."""
    step, units = (
        (1024.0, ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]) if binary else (1000.0, ["B", "KB", "MB", "GB", "TB", "PB"])
    )
    value = float(n)
    for unit in units:
        if abs(value) < step or unit == units[-1]:
            if abs(value) >= 1e4:  # past the largest unit: digits nobody reads, so scientific
                return f"{value:.3g} {unit}"
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= step
    raise AssertionError("unreachable")


def _literal_units(kind: QuantityKind) -> tuple[tuple[str, float], ...]:
    """The units :func:`format_literal` writes ``kind`` in, largest first: those of :data:`UNITS`
    with decimal prefixes in bytes (as PyTorch's ``bucket_cap_mb`` and the presets' GB/s are)."""
    decimal = [
        (name, scale)
        for name, (of_kind, scale) in UNITS.items()
        if of_kind == kind and not name.startswith(tuple(_BINARY)) and not name.endswith("b/s")
    ]
    return tuple(sorted(decimal, key=lambda unit: -unit[1]))


_LITERAL_UNITS = {kind: _literal_units(kind) for kind in ("bytes", "bandwidth", "compute", "time")}


def is_bare_number(value: object) -> TypeGuard[int | float]:
    """An int or float with no unit (true and false are not numbers, though Python's bools are ints)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_literal(value: float, kind: str) -> str:
    """``(25e6, 'bytes') -> '25 MB'``, ``(0.5, 'time') -> '500 ms'``: a quantity as a .plan would
    write it (the largest unit it is at least one of, no trailing zeros; zero in the base unit)."""
    units = _LITERAL_UNITS[kind]
    for unit, size in units:
        if value >= size or (value == 0 and size == 1.0):
            return f"{value / size:g} {unit}"
    unit, size = units[-1]
    return f"{value / size:g} {unit}"


def format_seconds(s: float) -> str:
    """``0.0123 -> '12.3 ms'``: three significant digits, from µs to hundreds of seconds; from a
    million seconds (11.6 days) on, scientific (``'2.26e+07 s'``), not a row of digits."""
    if s >= 1e6:
        return f"{s:.3g} s"
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def format_count(n: float) -> str:
    """``1234567 -> '1.23 M'``: three significant digits with k / M / B / T; beyond, scientific."""
    if abs(n) >= 1e15:
        return f"{n:.3g}"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.3g}"


def format_tflops(tflops: float) -> str:
    """TFLOP/s: whole numbers for GPUs, three digits for a CPU's fraction of one (not "0")."""
    return f"{tflops:.0f}" if tflops >= 10 else f"{tflops:.3g}"


def format_compute(flops: float) -> str:
    """``312e12 -> '312 TFLOPS'``, ``5e8 -> '0.5 GFLOPS'``."""
    return f"{flops / 1e12:.4g} TFLOPS" if flops >= 1e12 else f"{flops / 1e9:.4g} GFLOPS"


def format_bandwidth(bytes_per_s: float) -> str:
    """``25e9 -> '25 GB/s'`` (a link of one rank: '∞')."""
    return "∞" if bytes_per_s == float("inf") else f"{bytes_per_s / 1e9:.4g} GB/s"


def format_percent(fraction: float) -> str:
    """``0.071 -> '7%'``."""
    return f"{fraction * 100:.0f}%"


def format_signed_percent(fraction: float, decimals: int = 0) -> str:
    """``0.021 -> '+2%'``, ``-0.004 -> '0%'``: a change with its sign, and none where it rounds to
    zero (a "-0%" read as a loss that is not there)."""
    text = f"{abs(fraction):.{decimals}%}"
    if round(abs(fraction) * 100, decimals) == 0:
        return text
    return ("+" if fraction > 0 else "-") + text


def format_percent_fine(fraction: float) -> str:
    """``0.0931 -> '9.3%'``, ``0.22 -> '22%'``: one decimal where it tells two close numbers apart
    (a 9.3% saving against a ±9.4% margin), none for whole ones."""
    return f"{fraction:.1%}".replace(".0%", "%")
