"""A picture of a pipeline schedule: which rank runs what, when.

A small list scheduler replays each rank's operation order (as torch's schedules issue them)
under the data dependencies between stages, in units of one stage's forward time:

- forward F of stage s for micro-batch j waits for F of stage s - 1 (on the rank that holds it);
- backward B of stage s waits for B of stage s + 1 (the last stage's B for its own F);
- zero-bubble splits the backward into B (input gradient, 1 unit) and W (weight gradient,
  1 unit); W only waits for its B. The looped zero-bubble schedule runs W in idle time, as in
  ZB-H1 (Qi et al. 2023); ZB-V issues it in its own order (Sec. 6, torch ``ScheduleZBVZeroBubble``).

A full backward takes 2 units. Which rank holds which stage, and the rounds of the interleaved
schedules, come from :mod:`planc.stages`, as for the program and the cost model; a test checks
the cost model's closed forms (:func:`planc.stages.bubble_slots`,
:func:`planc.stages.chunks_in_flight`) against these replays for every schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from planc.stages import StageStyle, interleaved_rounds, rank_of_stage, stages_of_rank
from planc.zero_bubble import zbv_order

#: (kind, stage, micro-batch): one operation as a rank issues it.
Step = tuple[str, int, int]


@dataclass(frozen=True)
class Op:
    rank: int
    kind: str  # "F", "B" or "W"
    chunk: int  # global stage index 0 .. p*v-1
    micro_batch: int
    start: float
    end: float


def _one_forward_one_backward(stage: int, p: int, m: int, rank: int) -> list[Step]:
    """1F1B (and ZB-H1's F/B order): p - rank warm-up forwards, then one backward, one forward."""
    warm = min(p - rank, m)
    ops: list[Step] = [("F", stage, j) for j in range(warm)]
    forwards = warm
    for j in range(m):
        ops.append(("B", stage, j))
        if forwards < m:
            ops.append(("F", stage, forwards))
            forwards += 1
    return ops


def _interleaved(schedule: str, p: int, v: int, m: int, rank: int) -> list[Step]:
    """Interleaved 1F1B (Narayanan et al. 2021, Fig. 4): micro-batches in torch's rounds, stage by stage."""
    stages = stages_of_rank(rank, p, v)
    total = m * v
    group = m // interleaved_rounds(m, p)

    def forward(k: int) -> Step:
        rnd, within = divmod(k, group * v)
        return ("F", stages[within // group], rnd * group + within % group)

    def backward(k: int) -> Step:
        _, stage, j = forward(k)
        return ("B", stages[v - 1 - stages.index(stage)], j)

    hops = 2 if schedule == "interleaved" else 1
    warm = min((v - 1) * group + hops * (p - 1 - rank) + 1, total)
    ops = [forward(k) for k in range(warm)]
    forwards = warm
    for k in range(total):
        ops.append(backward(k))
        if forwards < total:
            ops.append(forward(forwards))
            forwards += 1
    return [op for op in ops if op[2] < m]


def _order(schedule: str, p: int, v: int, m: int, rank: int, style: StageStyle) -> list[Step]:
    """The (kind, stage, micro-batch) sequence a rank issues."""
    if style == "v":
        return zbv_order(p, m, rank)
    if schedule == "gpipe":
        return [("F", rank, j) for j in range(m)] + [("B", rank, j) for j in range(m)]
    if v == 1 and schedule in ("1f1b", "zero-bubble"):
        return _one_forward_one_backward(rank, p, m, rank)
    return _interleaved(schedule, p, v, m, rank)


@dataclass
class _Replay:
    """The state of one replay: what has finished when, and each rank's clock."""

    p: int
    last: int
    split: bool
    done: dict[tuple[str, int, int], float]
    clock: dict[int, float]
    pending_w: dict[int, list[tuple[int, int]]]
    ops: list[Op]

    def ready(self, kind: str, stage: int, j: int) -> float | None:
        """When the inputs of an operation are there (None: not yet)."""
        if kind == "F":
            return 0.0 if stage == 0 else self.done.get(("F", stage - 1, j))
        if kind == "W":
            return self.done.get(("B", stage, j))
        if stage == self.last:
            return self.done.get(("F", stage, j))
        return self.done.get(("B", stage + 1, j))

    def run(self, rank: int, kind: str, stage: int, j: int, at: float, length: float) -> None:
        start = max(self.clock[rank], at)
        self.ops.append(Op(rank, kind, stage, j, start, start + length))
        self.clock[rank] = start + length
        self.done[(kind, stage, j)] = self.clock[rank]

    def fill_with_weights(self, rank: int, until: float) -> None:
        """Looped zero-bubble: spend idle time before ``until`` on deferred weight gradients."""
        while self.pending_w[rank] and self.clock[rank] + 1 <= until:
            stage, j = self.pending_w[rank].pop(0)
            self.run(rank, "W", stage, j, self.clock[rank], 1.0)


def simulate(schedule: str, p: int, v: int, m: int, style: StageStyle = "looped") -> list[Op]:
    """Replay the schedule; returns every operation with its start and end time."""
    split = schedule == "zero-bubble"
    queues = {r: _order(schedule, p, v, m, r, style) for r in range(p)}
    state = _Replay(p, p * v - 1, split, {}, {r: 0.0 for r in range(p)}, {r: [] for r in range(p)}, [])
    remaining = sum(len(q) for q in queues.values())
    while remaining:
        progressed = False
        for r in range(p):
            if not queues[r]:
                continue
            kind, stage, j = queues[r][0]
            if rank_of_stage(stage, p, v, style) != r:
                raise RuntimeError(f"rank {r} was given stage {stage}")  # a bug in the orders above
            t_ready = state.ready(kind, stage, j)
            if t_ready is None:
                continue
            if split and style == "looped":
                state.fill_with_weights(r, t_ready)
            length = 1.0 if (kind != "B" or split) else 2.0
            state.run(r, kind, stage, j, t_ready, length)
            if split and style == "looped" and kind == "B":
                state.pending_w[r].append((stage, j))
            queues[r].pop(0)
            remaining -= 1
            progressed = True
        if not progressed:
            raise RuntimeError("schedule deadlocked")  # a bug in the orders above
    for r in range(p):  # flush the remaining weight gradients
        state.fill_with_weights(r, float("inf"))
    return state.ops


def ascii_timeline(
    schedule: str, p: int, v: int, m: int, width: int = 96, max_ranks: int = 8, style: StageStyle = "looped"
) -> str:
    """Rows of F/B/W/. per rank; time compressed to at most ``width`` columns."""
    shown_m = min(m, 2 * p)
    ops = simulate(schedule, p, v, shown_m, style)
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
        lines.append(f"  rank {r:>3} |{_row(by_rank.get(r, []), cols, scale)}|")
    idle = 1 - sum(o.end - o.start for o in ops) / (end * p)
    note = f"  {shown_m} of {m} micro-batches shown" if shown_m < m else f"  {m} micro-batches"
    if scale == 1.0:
        note += f"; F forward, B backward{', W weight gradient' if schedule == 'zero-bubble' else ''}, . idle"
    else:
        note += f"; # busy, . idle; 1 column = {scale:.1f} chunk-forward times"
    note += f"; idle {idle:.0%} of this window"
    return "\n".join(lines + [note])


def _row(ops: list[Op], cols: int, scale: float) -> str:
    row = []
    for c in range(cols):
        lo, hi = c * scale, (c + 1) * scale
        if scale == 1.0:
            hit = next((o for o in ops if o.start <= lo + 0.5 < o.end), None)
            row.append(hit.kind if hit else ".")
        else:  # compressed: busy or idle
            busy = sum(max(0.0, min(o.end, hi) - max(o.start, lo)) for o in ops)
            row.append("#" if busy >= 0.5 * scale else ".")
    return "".join(row)
