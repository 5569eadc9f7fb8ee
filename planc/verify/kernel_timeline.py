"""Where a GPU step's time went, read off the kernels ``torch.profiler`` recorded.

On the first GPU run (docs/gpu.md) the kernels of a step added up to 712 ms while the step took
850: the device sat idle between kernels, which no per-kernel measurement shows. This module takes
the kernel events of one profiled step (the Chrome trace ``torch.profiler`` exports: events with
``"cat": "kernel"``, a start ``ts`` and a duration ``dur`` in microseconds) and splits the step's
wall time into what the cost model also names:

- ``compute``: time some computing kernel (anything but a collective) runs, the union of their
  intervals (overlapping streams counted once);
- ``communication``: the union of the collectives' kernels (NCCL's ``nccl...Kernel``), and
  ``communication_exposed``, the part of it no computing kernel overlaps -- what the model calls
  a group's "exposed" time;
- ``idle``: the wall time no kernel covers (the host launching, waiting, or a pipeline bubble).

and the kernels' own seconds by kind (GEMM, attention, loss, optimizer, collective, other).
Pure Python: no torch, so it is tested on CPU with made-up events.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

#: Kernel kinds by name, the first match wins: cuBLAS/CUTLASS GEMMs are "gemm", "xmma", "cutlass" or
#: "nvjet" kernels; SDPA's flash and cuDNN kernels name themselves; NCCL's kernels start "nccl".
KERNEL_KINDS = (
    ("collective", re.compile(r"nccl", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|nvjet|gemv|splitk", re.I)),
    ("loss", re.compile(r"softmax|nll_loss|cross_entropy", re.I)),
    ("optimizer", re.compile(r"multi_tensor|adam|foreach", re.I)),
)


def kernel_kind(name: str) -> str:
    return next((kind for kind, pattern in KERNEL_KINDS if pattern.search(name)), "other")


def kernel_events(trace_path: Path) -> list[tuple[str, float, float]]:
    """(name, start, end) in seconds of every kernel in a Chrome trace from ``torch.profiler``."""
    events = json.loads(Path(trace_path).read_text()).get("traceEvents", [])
    return [
        (e.get("name", ""), e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6)
        for e in events
        if e.get("cat") == "kernel" and "ts" in e and "dur" in e
    ]


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Length of the intersection of two unions (each sorted and disjoint)."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, end - start)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def step_split(kernels: list[tuple[str, float, float]], wall_s: float) -> dict:
    """Seconds of one step by what the device did (module docstring), ``wall_s`` its wall time."""
    compute = _union([(s, e) for name, s, e in kernels if kernel_kind(name) != "collective"])
    communication = _union([(s, e) for name, s, e in kernels if kernel_kind(name) == "collective"])
    busy = _length(_union([(s, e) for _, s, e in kernels]))
    comm = _length(communication)
    by_kind: dict[str, float] = {}
    for name, start, end in kernels:
        kind = kernel_kind(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + (end - start)
    return {
        "wall_s": wall_s,
        "compute_s": _length(compute),
        "communication_s": comm,
        "communication_exposed_s": comm - _overlap(communication, compute),
        "idle_s": max(0.0, wall_s - busy),
        "kernels_s": by_kind,
    }
