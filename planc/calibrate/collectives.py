"""Collective bandwidth and latency over the real process group, fitted to the cost model's formulas.

Each collective runs on every rank of a group at each message size; a size's time is the median
over repetitions of the slowest rank's (all-reduced with MAX, so one fast rank cannot flatter a
ring). The fit is the cost model's own alpha-beta form (:mod:`planc.cost.comm`, Thakur et al.
2005): ``t = steps(p) * alpha + volume(p, n) / beta`` with, for a buffer of n bytes over p ranks,

- all-reduce (ring): steps 2 (p - 1), volume 2 (p - 1) / p * n;
- all-gather, reduce-scatter (ring): steps p - 1, volume (p - 1) / p * n;
- send/recv (each rank sends n bytes to its ring neighbour and receives n): steps 1, volume n,

solved by least squares on relative error (sizes span decades; an absolute fit would ignore the
small ones), alpha clamped at 0. Groups: the ranks of one node (``intra_node``) and, under torchrun
on several nodes (``WORLD_SIZE > LOCAL_WORLD_SIZE``), the ranks with the same local rank across
nodes (``inter_node``), as data parallelism across nodes uses them.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from planc.calibrate.timing import synchronize
from planc.spec.hardware_profile import CollectiveFit

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


def model_terms(kind: str, p: int, nbytes: float) -> tuple[float, float]:
    """(latency steps, bytes over the bandwidth) of one ``kind`` collective in planc's cost model."""
    if kind == "all_reduce":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p * nbytes
    if kind in ("all_gather", "reduce_scatter"):
        return float(p - 1), (p - 1) / p * nbytes
    return 1.0, float(nbytes)


def fit_alpha_beta(kind: str, p: int, points: list[tuple[float, float]]) -> tuple[float, float]:
    """(alpha seconds, beta bytes/s) minimising the relative error of t = steps alpha + volume / beta."""
    rows = [(model_terms(kind, p, n), t) for n, t in points]
    # Relative error: divide each equation by its measured time.
    a = [(steps / t, volume / t) for (steps, volume), t in rows]
    s11 = sum(x * x for x, _ in a)
    s12 = sum(x * y for x, y in a)
    s22 = sum(y * y for _, y in a)
    r1 = sum(x for x, _ in a)
    r2 = sum(y for _, y in a)
    det = s11 * s22 - s12 * s12
    alpha, inv_beta = ((s22 * r1 - s12 * r2) / det, (s11 * r2 - s12 * r1) / det) if det > 0 else (0.0, 0.0)
    if alpha < 0 or inv_beta <= 0:
        # A negative start-up cost is noise on the small sizes: clamp it and refit the bandwidth.
        alpha = max(alpha, 0.0)
        inv_beta = _refit_beta(a, alpha)
    return alpha, 1.0 / max(inv_beta, 1e-15)


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
    local = torch.tensor([statistics.median(samples)], dtype=torch.float64)
    dist.all_reduce(local, op=dist.ReduceOp.MAX, group=group)
    return float(local.item())


def measure_group(group, medium: str, sizes, device: torch.device, repeats: int) -> list[CollectiveFit]:
    """One fit per collective kind over ``group`` (every rank of the group calls this)."""
    p = dist.get_world_size(group)
    fits = []
    for kind in KINDS:
        points = [
            (float(n), time_collective(run_collective(kind, n, group, device), group, device, repeats)) for n in sizes
        ]
        alpha, beta = fit_alpha_beta(kind, p, points)
        fits.append(CollectiveFit(kind=kind, group_size=p, medium=medium, latency=alpha, bandwidth=beta, points=points))
    return fits


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
