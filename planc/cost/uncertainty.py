"""How far the cost model's step times are from published runs: the planner's uncertainty band.

``accuracy.json`` next to this module is written by ``python bench/accuracy.py --write-stats``
from ``tests/data/published_runs.json`` (a test checks it is current); docs/accuracy.md lists
its fields. The error of a run is predicted throughput / reported throughput - 1. Families are
``tune`` (what the model was built on) or ``test`` (held out); the band is taken from the
held-out families only.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

ACCURACY_FILE = Path(__file__).with_name("accuracy.json")


@lru_cache(maxsize=1)
def accuracy_table() -> dict:
    """The whole file: ``band`` and per-family statistics under ``families``."""
    return json.loads(ACCURACY_FILE.read_text(encoding="utf-8"))


def step_time_uncertainty() -> float:
    """Typical relative error of a predicted step time on a program the model was not tuned on:
    the median, over the held-out families in the goal, of each family's median |error|."""
    return float(accuracy_table()["band"]["step_time_relative"])
