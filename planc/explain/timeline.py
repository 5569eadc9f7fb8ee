"""A picture of a pipeline schedule: which rank runs what, when.

A small list scheduler replays each rank's operation order (as torch's schedules issue them)
under the data dependencies between stages, in units of one chunk's forward time:

- forward F of chunk c for micro-batch j waits for F of chunk c - 1 (on the previous rank);
- backward B of chunk c waits for B of chunk c + 1 (the last chunk's B for its own F);
- zero-bubble splits the backward into B (input gradient, 1 unit) and W (weight gradient,
  1 unit); W only waits for its B and fills idle time, as in ZB-H1 (Qi et al. 2023).

A full backward takes 2 units. The picture is for explanation; the cost model's bubble formula
(:func:`planc.cost.builtin.bubble_slots`) is what the numbers use.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    rank: int
    kind: str  # "F", "B" or "W"
    chunk: int  # global chunk index 0 .. p*v-1
    micro_batch: int
    start: float
    end: float


def _order(schedule: str, p: int, v: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """The (kind, local chunk, micro-batch) sequence a rank issues."""
    if schedule == "gpipe":
        return [("F", 0, j) for j in range(m)] + [("B", 0, j) for j in range(m)]
    if v == 1 and schedule in ("1f1b", "zero-bubble"):
        warm = min(p - rank, m)
        ops = [("F", 0, j) for j in range(warm)]
        f = warm
        for j in range(m):
            ops.append(("B", 0, j))
            if f < m:
                ops.append(("F", 0, f))
                f += 1
        return ops
    # Interleaved (Narayanan et al. 2021, Fig. 4): micro-batches in rounds, chunk by chunk;
    # torch's rounds: max(1, m // p) of m / rounds micro-batches each.
    total = m * v
    g = m // max(1, m // p)

    def fwd(k: int) -> tuple[int, int]:
        rnd, within = divmod(k, g * v)
        return within // g, rnd * g + within % g

    def bwd(k: int) -> tuple[int, int]:
        chunk, mb = fwd(k)
        return v - 1 - chunk, mb

    hops = 2 if schedule == "interleaved" else 1
    warm = min((v - 1) * g + hops * (p - 1 - rank) + 1, total)
    ops = [("F",) + fwd(k) for k in range(warm)]
    f = warm
    for k in range(total):
        ops.append(("B",) + bwd(k))
        if f < total:
            ops.append(("F",) + fwd(f))
            f += 1
    return [(kind, c, j) for kind, c, j in ops if j < m]


def simulate(schedule: str, p: int, v: int, m: int) -> list[Op]:
    """Replay the schedule; returns every operation with its start and end time."""
    split = schedule == "zero-bubble"
    queues = {r: list(_order(schedule, p, v, m, r)) for r in range(p)}
    done: dict[tuple[str, int, int], float] = {}
    clock = {r: 0.0 for r in range(p)}
    pending_w: dict[int, list[tuple[int, int, float]]] = {r: [] for r in range(p)}
    ops: list[Op] = []
    last = p * v - 1

    def ready(kind: str, chunk: int, j: int) -> float | None:
        if kind == "F":
            return 0.0 if chunk == 0 else done.get(("F", chunk - 1, j))
        if chunk == last:
            return done.get(("F", chunk, j))
        return done.get(("B", chunk + 1, j))

    remaining = sum(len(q) for q in queues.values())
    while remaining:
        progressed = False
        for r in range(p):
            q = queues[r]
            if not q:
                continue
            kind, local, j = q[0]
            chunk = local * p + r
            t_ready = ready(kind, chunk, j)
            if t_ready is None:
                continue
            # Zero-bubble: spend idle time on deferred weight gradients.
            while split and pending_w[r] and clock[r] + 1 <= t_ready:
                wc, wj, _ = pending_w[r].pop(0)
                ops.append(Op(r, "W", wc, wj, clock[r], clock[r] + 1))
                clock[r] += 1
            start = max(clock[r], t_ready)
            length = 1.0 if (kind == "F" or split) else 2.0
            ops.append(Op(r, kind, chunk, j, start, start + length))
            clock[r] = start + length
            done[(kind, chunk, j)] = clock[r]
            if split and kind == "B":
                pending_w[r].append((chunk, j, clock[r]))
            q.pop(0)
            remaining -= 1
            progressed = True
        if not progressed:
            raise RuntimeError("schedule deadlocked")  # a bug in the order above
    for r in range(p):  # flush the remaining weight gradients
        for wc, wj, _ in pending_w[r]:
            ops.append(Op(r, "W", wc, wj, clock[r], clock[r] + 1))
            clock[r] += 1
    return ops


def ascii_timeline(schedule: str, p: int, v: int, m: int, width: int = 96, max_ranks: int = 8) -> str:
    """Rows of F/B/W/. per rank; time compressed to at most ``width`` columns."""
    shown_m = min(m, 2 * p)
    ops = simulate(schedule, p, v, shown_m)
    end = max(o.end for o in ops)
    scale = max(1.0, end / width)
    cols = int(end / scale + 0.999)
    ranks = list(range(p)) if p <= max_ranks else list(range(max_ranks // 2)) + list(range(p - max_ranks // 2, p))
    by_rank: dict[int, list[Op]] = {}
    for o in ops:
        by_rank.setdefault(o.rank, []).append(o)
    lines = []
    for i, r in enumerate(ranks):
        if i and r != ranks[i - 1] + 1:
            lines.append("           ⋮")
        row = []
        for c in range(cols):
            lo, hi = c * scale, (c + 1) * scale
            if scale == 1.0:
                hit = next((o for o in by_rank.get(r, []) if o.start <= lo + 0.5 < o.end), None)
                row.append(hit.kind if hit else ".")
            else:  # compressed: busy or idle
                busy = sum(max(0.0, min(o.end, hi) - max(o.start, lo)) for o in by_rank.get(r, []))
                row.append("#" if busy >= 0.5 * scale else ".")
        lines.append(f"  rank {r:>3} |{''.join(row)}|")
    idle = 1 - sum(o.end - o.start for o in ops) / (end * p)
    note = f"  {shown_m} of {m} micro-batches shown" if shown_m < m else f"  {m} micro-batches"
    if scale == 1.0:
        note += f"; F forward, B backward{', W weight gradient' if schedule == 'zero-bubble' else ''}, . idle"
    else:
        note += f"; # busy, . idle; 1 column = {scale:.1f} chunk-forward times"
    note += f"; idle {idle:.0%} of this window"
    return "\n".join(lines + [note])
