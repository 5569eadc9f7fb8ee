"""Collective bandwidth and latency over the real process group, fitted to the cost model's formulas.

Each collective runs on every rank of a group at each message size; a size's time is the median
over repetitions of the slowest rank's (all-reduced with MAX, so one fast rank cannot flatter a
ring). The fit is the cost model's own alpha-beta form (:mod:`planc.cost.comm`, Thakur et al.
2005): ``t = steps(p) * alpha + volume(p, n) / beta`` with, for a buffer of n bytes over p ranks,

- all-reduce (ring): steps 2 (p - 1), volume 2 (p - 1) / p * n;
- all-gather, reduce-scatter (ring): steps p - 1, volume (p - 1) / p * n;
- send/recv (each rank sends n bytes to its ring neighbour and receives n): steps 1, volume n;
- broadcast (from the group's first rank; every other rank receives n bytes): steps ceil(log2 p),
  volume n -- what ``ZeroRedundancyOptimizer`` pays per rank's buffer when it syncs the parameters
  (:func:`planc.cost.comm.broadcasts_seconds`),

solved by least squares on relative error (sizes span decades; an absolute fit would ignore the
small ones), alpha clamped at 0. Timings that identify no such pair (:func:`fit_problem`: times
that do not grow with the size, as the small messages of ``--quick`` or a tiny plan give on gloo)
are timed again at larger sizes; a fit still without one is kept with its ``problem``, and the
cost model prices that kind with the data sheet instead
(:func:`planc.spec.hardware_profile.hardware_values`).

Groups: the ranks of one node (``intra_node``) and, under torchrun on several nodes
(``WORLD_SIZE > LOCAL_WORLD_SIZE``), the ranks with the same local rank across nodes
(``inter_node``), as data parallelism across nodes uses them.
"""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist

from planc.calibrate.shapes import geometric_sizes
from planc.calibrate.timing import synchronize
from planc.spec.hardware_profile import CollectiveFit
from planc.units import format_bytes, format_seconds

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "broadcast")


def model_terms(kind: str, p: int, nbytes: float) -> tuple[float, float]:
    """(latency steps, bytes over the bandwidth) of one ``kind`` collective in planc's cost model."""
    if kind == "all_reduce":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p * nbytes
    if kind in ("all_gather", "reduce_scatter"):
        return float(p - 1), (p - 1) / p * nbytes
    if kind == "broadcast":
        return float(math.ceil(math.log2(p))), float(nbytes)
    return 1.0, float(nbytes)


def fit_alpha_beta(kind: str, p: int, points: list[tuple[float, float]]) -> tuple[float, float]:
    """(alpha seconds, beta bytes/s) minimising the relative error of t = steps alpha + volume / beta."""
    alpha, inv_beta = _fit(_relative_rows(kind, p, points))
    return alpha, 1.0 / max(inv_beta, 1e-15)


def _fit(a: list[tuple[float, float]]) -> tuple[float, float]:
    """(alpha, 1 / beta) over the relative rows, alpha clamped at 0; 1 / beta may come out <= 0 (no fit)."""
    alpha, inv_beta = _solve(a)
    if alpha < 0 or inv_beta <= 0:
        # A negative start-up cost is noise on the small sizes: clamp it and refit the bandwidth.
        alpha = max(alpha, 0.0)
        inv_beta = _refit_beta(a, alpha)
    return alpha, inv_beta


def _relative_rows(kind: str, p: int, points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Each equation ``steps alpha + volume / beta = t`` divided by its measured t (relative error)."""
    rows = [(model_terms(kind, p, n), t) for n, t in points]
    return [(steps / t, volume / t) for (steps, volume), t in rows]


def _solve(a: list[tuple[float, float]]) -> tuple[float, float]:
    """Unconstrained least squares of ``alpha x + inv_beta y = 1`` over the rows (x, y); (0, 0) when singular."""
    s11 = sum(x * x for x, _ in a)
    s12 = sum(x * y for x, y in a)
    s22 = sum(y * y for _, y in a)
    r1 = sum(x for x, _ in a)
    r2 = sum(y for _, y in a)
    det = s11 * s22 - s12 * s12
    return ((s22 * r1 - s12 * r2) / det, (s11 * r2 - s12 * r1) / det) if det > 0 else (0.0, 0.0)


#: The largest message must take this many times the smallest's time, or the bandwidth term is lost
#: in the start-up cost and the noise (gloo's small messages vary by 10x between runs on a busy CPU).
MIN_TIME_GROWTH = 2.0
#: A fit that misses the timings by more than this (RMS of the relative errors) does not describe them.
MAX_RELATIVE_RMS = 0.5
#: The largest message must be this many times the smallest: a narrower range cannot tell the start-up
#: cost from the bandwidth (--quick on a tiny plan spans 4 to 33 KB, all start-up cost on gloo).
MIN_SIZE_SPAN = 64


def fit_problem(kind: str, p: int, points: list[tuple[float, float]]) -> str | None:
    """Why ``points`` identify no alpha-beta pair (None when they do), in words for the profile's notes.

    The sizes must span a wide range and the timings must grow with the message size (else any
    bandwidth fits, and least squares returns an absurd one: clamped to 1e15 B/s, or a tiny one through
    the noise); the fit (alpha clamped at 0, as published) must have a positive bandwidth and must
    describe the points.
    """
    if len(points) < 2:
        return "fewer than two message sizes were timed"
    ordered = sorted(points)
    t0, t1 = ordered[0][1], ordered[-1][1]
    shown = ", ".join(f"{format_bytes(n)} in {format_seconds(t)}" for n, t in ordered)
    if ordered[-1][0] < MIN_SIZE_SPAN * ordered[0][0]:
        return f"the sizes span less than {MIN_SIZE_SPAN}x, too little to tell start-up cost from bandwidth ({shown})"
    if t1 < MIN_TIME_GROWTH * t0:
        return f"the time does not grow with the message size ({shown})"
    a = _relative_rows(kind, p, points)
    alpha, inv_beta = _fit(a)
    if inv_beta <= 0:
        return f"no positive bandwidth fits the timings ({shown})"
    rms = math.sqrt(sum((alpha * x + inv_beta * y - 1) ** 2 for x, y in a) / len(a))
    if rms > MAX_RELATIVE_RMS:
        return f"the best fit misses the timings by {rms:.0%} RMS ({shown})"
    return None


#: Largest buffer timed again when the first sizes give no fit (the re-measurement's cost and memory).
RETRY_LARGEST = 256 * 2**20


def retry_sizes(largest: int) -> tuple[int, ...]:
    """Larger sizes to time when the planned ones give no fit: 4x to 256x the largest, up to RETRY_LARGEST."""
    top = min(largest * 256, RETRY_LARGEST)
    return geometric_sizes(largest * 4, top) if top >= largest * 4 else ()


def _refit_beta(a: list[tuple[float, float]], alpha: float) -> float:
    """1 / beta by least squares with alpha fixed: minimise sum (alpha x + y / beta - 1)^2."""
    num = sum(y * (1 - alpha * x) for x, y in a)
    den = sum(y * y for _, y in a)
    return num / den if den > 0 else 1e-15


def run_collective(kind: str, nbytes: int, group, device: torch.device):
    """A callable that runs one ``kind`` collective of ``nbytes`` (float32) on ``group``."""
    p = dist.get_world_size(group)
    elements = max(p, nbytes // 4 // p * p)
    full = torch.ones(elements, device=device)
    shard = torch.ones(elements // p, device=device)
    rank = dist.get_rank(group)
    ranks = dist.get_process_group_ranks(group)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if kind == "all_gather":
        return lambda: dist.all_gather_single(full, shard, group=group)
    if kind == "reduce_scatter":
        return lambda: dist.reduce_scatter_single(shard, full, group=group)
    if kind == "broadcast":
        return lambda: dist.broadcast(full, src=ranks[0], group=group)
    incoming = torch.empty_like(full)
    to, source = ranks[(rank + 1) % p], ranks[(rank - 1) % p]

    def send_recv():
        ops = [dist.P2POp(dist.isend, full, to, group), dist.P2POp(dist.irecv, incoming, source, group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return send_recv


def time_collective(fn, group, device: torch.device, repeats: int) -> float:
    """Median over ``repeats`` of the slowest rank's seconds for one call."""
    fn()
    samples = []
    for _ in range(repeats):
        dist.barrier(group=group)
        synchronize(device)
        began = time.perf_counter()
        fn()
        synchronize(device)
        samples.append(time.perf_counter() - began)
    # On the group's device: an NCCL group takes no CPU tensor (torch: "No backend type associated
    # with device type cpu").
    local = torch.tensor([statistics.median(samples)], dtype=torch.float64, device=device)
    dist.all_reduce(local, op=dist.ReduceOp.MAX, group=group)
    return float(local.item())


def measure_group(group, medium: str, sizes, device: torch.device, repeats: int) -> list[CollectiveFit]:
    """One fit per collective kind over ``group`` (every rank of the group calls this)."""
    p = dist.get_world_size(group)
    fits = []
    for kind in KINDS:
        # Every rank holds the same points (the slowest rank's times), so every rank decides the same.
        points = _timed(kind, sizes, group, device, repeats)
        problem = fit_problem(kind, p, points)
        larger = retry_sizes(max(sizes)) if problem else ()
        if larger:  # too small to see the bandwidth (--quick, a tiny plan): time larger messages
            points += _timed(kind, larger, group, device, repeats)
            problem = fit_problem(kind, p, points)
        alpha, beta = fit_alpha_beta(kind, p, points)
        fit = CollectiveFit(kind=kind, group_size=p, medium=medium, latency=alpha, bandwidth=beta, points=points)
        fits.append(fit.model_copy(update={"problem": problem}) if problem else fit)
    return fits


def _timed(kind: str, sizes, group, device: torch.device, repeats: int) -> list[tuple[float, float]]:
    return [(float(n), time_collective(run_collective(kind, n, group, device), group, device, repeats)) for n in sizes]


def node_groups(world: int, per_node: int):
    """(this rank's intra-node group or None, its inter-node group or None); every rank makes every group."""
    rank = dist.get_rank()
    nodes = world // per_node
    intra = inter = None
    if per_node > 1:
        for node in range(nodes):
            group = dist.new_group(list(range(node * per_node, (node + 1) * per_node)))
            if rank // per_node == node:
                intra = group
    if nodes > 1:
        for local in range(per_node):
            group = dist.new_group([node * per_node + local for node in range(nodes)])
            if rank % per_node == local:
                inter = group
    return intra, inter
