"""Sub-commands of the ``planc`` CLI, one module each (see :mod:`planc.cli`)."""

from __future__ import annotations

import argparse
import math


def tolerance(text: str) -> float:
    """``--tolerance``: a fraction in [0, 1) (argparse reports the error with the usage line)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; e.g. --tolerance 0.05 for 5%") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(
            f"{text} is not a finite number; give a fraction in [0, 1), e.g. --tolerance 0.05 for 5%"
        )
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text} is outside [0, 1); e.g. --tolerance 0.05 for 5%")
    return value
