"""Timing a callable on CPU or CUDA: warm-up, then the median of repeated runs.

On CUDA the clock is a pair of events around each repetition (the kernels are asynchronous;
``torch.cuda.Event.elapsed_time``); on CPU ``time.perf_counter``. The median, not the mean, so
that a repetition interrupted by another process on a shared machine does not move the result.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_seconds(fn: Callable[[], object], device: torch.device, *, repeats: int, warmup: int = 2) -> float:
    """Median wall seconds of one call of ``fn`` (``repeats`` timed calls after ``warmup``)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def repeats_for(seconds_per_call: float, budget: float, *, least: int = 3, most: int = 50) -> int:
    """How many repetitions fit ``budget`` seconds, within [least, most]."""
    if seconds_per_call <= 0:
        return most
    return max(least, min(most, int(budget / seconds_per_call)))


def timed(fn: Callable[[], object], device: torch.device, budget: float) -> float:
    """Median seconds of ``fn``, with as many repetitions as ``budget`` seconds allow (one probe first)."""
    probe = median_seconds(fn, device, repeats=1, warmup=1)
    return median_seconds(fn, device, repeats=repeats_for(probe, budget), warmup=1)


def slowest_rank(seconds: float, device: torch.device) -> float:
    """The largest of every rank's ``seconds`` when a process group is up (all ranks must call),
    else ``seconds``."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return seconds
    value = torch.tensor([seconds], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value)


def paired_difference(
    fn: Callable[[], object], reference: Callable[[], object], device: torch.device, budget: float
) -> float:
    """Median of (``fn`` - ``reference``) seconds over alternating repetitions, this rank's.

    Paired and alternating, so that a shared machine's load, which moves from one second to the
    next, weighs on both sides of each difference alike (timing each side on its own, minutes
    apart, left differences that were mostly load). Under a process group every rank runs as many
    repetitions as the slowest rank's probe allows (the callables may meet in collectives)."""
    fn()
    reference()
    probe = slowest_rank(median_seconds(fn, device, repeats=1, warmup=0), device)
    differences = []
    for _ in range(repeats_for(2 * probe, budget, least=5)):
        seconds = median_seconds(fn, device, repeats=1, warmup=0)
        differences.append(seconds - median_seconds(reference, device, repeats=1, warmup=0))
    return statistics.median(differences)


def interleaved_medians(fns: list[Callable[[], object]], device: torch.device, budget: float) -> list[float]:
    """Median seconds of each of ``fns``, timed in rounds that run every one of them once, so that
    a shared machine's load, which moves from one second to the next, weighs on all of them alike
    (timed one after the other, a burst during one measurement set it 2x apart from the rest)."""
    for fn in fns:
        fn()
    probe = sum(median_seconds(fn, device, repeats=1, warmup=0) for fn in fns)
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats_for(probe, budget, least=5)):
        for fn, own in zip(fns, samples):
            own.append(median_seconds(fn, device, repeats=1, warmup=0))
    return [statistics.median(own) for own in samples]


#: Measurements of a wrapper's cost before it is taken as 0 (see :func:`beyond_parts`).
ATTEMPTS = 3


def beyond_parts(measure: Callable[[], tuple[float, float]], attempts: int = ATTEMPTS) -> float:
    """``total - parts`` from ``measure() -> (total, parts)``, measured again while the total does not
    exceed its parts, at most ``attempts`` times, else 0.

    A wrapped step that costs no more than the collectives it contains is a disturbed measurement,
    not a free wrapper: a fresh install's first calibration compiles and imports beside it (CI twice
    read DTensor TP at 0 per block where quiet runs read 6-10 ms). ``measure`` must return the
    slowest rank's values (:func:`slowest_rank`) so that every rank takes the same decision."""
    for _ in range(attempts):
        total, parts = measure()
        if total > parts:
            return total - parts
    return 0.0
