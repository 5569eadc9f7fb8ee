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
