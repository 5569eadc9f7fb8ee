"""The legal values of each layout key, given what the plan fixes and what divides what.

A key the plan fixes is the only value tried (the planner never changes it; the spec checks
already rejected impossible fixed values). For an ``auto`` key the candidates are:

- tp: divisors of the world size that divide heads, kv_heads, ffn and the padded vocabulary,
  at most ``per_node`` (tensor parallelism stays inside a node);
- pp: divisors of world / tp, at most ``layers``;
- dp: the rest, world / (tp x pp), which must divide ``global_batch``;
- zero: 0..3 when dp > 1, else 0;
- recompute: none, selective, full;
- sequence_parallel: false, true when tp > 1;
- schedule (pp > 1): 1F1B, interleaved with v in {2, 4, 8} (pp x v <= layers), zero-bubble
  with v in {1, 2, 4, 8}. GPipe is tried only when the plan asks for it: it has 1F1B's bubble
  and holds every micro-batch's activations, so 1F1B dominates it;
- micro_batch: divisors of global_batch / dp, ascending (the search stops at the first that
  does not fit: memory grows with the micro-batch);
- the schedule's own rules on m = global_batch / (dp x micro_batch): 1F1B needs m >= pp
  (torch ``Schedule1F1B``); interleaved and zero-bubble need m divisible by max(1, m // pp)
  (torch's rounds).
"""

from __future__ import annotations

from planc.spec.plan import Plan

AUTO = "auto"
RECOMPUTE_ORDER = ("none", "selective", "full")
VIRTUAL_STAGE_CHOICES = (2, 4, 8)


def _divisors(n: int) -> list[int]:
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def tp_options(plan: Plan) -> list[int]:
    tp = plan.layout.tp
    if tp != AUTO:
        return [tp]
    m, world = plan.model, plan.world_size
    return [d for d in _divisors(world) if d <= plan.hardware.per_node
            and all(x % d == 0 for x in (m.heads, m.kv_heads, m.ffn, m.padded_vocab))]


def pp_options(plan: Plan, tp: int) -> list[int]:
    pp = plan.layout.pp
    if pp != AUTO:
        return [pp]
    return [d for d in _divisors(plan.world_size // tp) if d <= plan.model.layers]


def degree_options(plan: Plan) -> list[tuple[int, int, int]]:
    """Every legal (tp, pp, dp) with tp x pp x dp = world."""
    world, gb = plan.world_size, plan.train.global_batch
    out = []
    for tp in tp_options(plan):
        if world % tp:
            continue
        for pp in pp_options(plan, tp):
            if (world // tp) % pp:
                continue
            dp = world // (tp * pp)
            if plan.layout.dp != AUTO and dp != plan.layout.dp:
                continue
            if gb % dp:
                continue
            out.append((tp, pp, dp))
    return out


def zero_options(plan: Plan, dp: int) -> list[int]:
    zero = plan.layout.zero
    if zero != AUTO:
        return [zero]
    return [0, 1, 2, 3] if dp > 1 else [0]


def recompute_options(plan: Plan) -> list[str]:
    r = plan.layout.recompute
    return [r] if r != AUTO else list(RECOMPUTE_ORDER)


def sp_options(plan: Plan, tp: int) -> list[bool]:
    sp = plan.layout.sequence_parallel
    if tp == 1:
        return [False]
    return [sp] if sp != AUTO else [False, True]


def schedule_options(plan: Plan, pp: int) -> list[tuple[str | None, int]]:
    """(schedule, virtual_stages) pairs for ``pp`` stages."""
    if pp == 1:
        return [(None, 1)]
    layers = plan.model.layers
    sched, v_fixed = plan.layout.schedule, plan.layout.virtual_stages
    vs = [v for v in VIRTUAL_STAGE_CHOICES if pp * v <= layers] if v_fixed == AUTO else [v_fixed]
    out: list[tuple[str | None, int]] = []
    for s in ([sched] if sched != AUTO else ["1f1b", "interleaved", "zero-bubble"]):
        if s in ("1f1b", "gpipe"):
            if v_fixed in (AUTO, 1):
                out.append((s, 1))
        elif s == "interleaved":
            out += [(s, v) for v in vs if v >= 2]
        elif s == "zero-bubble":
            out += [(s, v) for v in ([1] if v_fixed == AUTO else []) + vs]
    return out


def micro_batch_options(plan: Plan, dp: int) -> list[int]:
    gb, mb = plan.train.global_batch, plan.train.micro_batch
    local = gb // dp
    if mb != AUTO:
        return [mb] if local % mb == 0 else []
    return _divisors(local)


def schedule_composes(schedule: str | None, dp: int, zero: int) -> bool:
    """Whether the schedule works with this kind of data parallelism (``pipeline.check`` rejects the rest):
    the zero-bubble schedules' separate weight-gradient pass escapes DDP and ZeRO-3 (measured in
    tests/distributed), so with dp > 1 they run only with ZeRO-2."""
    return not (schedule == "zero-bubble" and dp > 1 and zero != 2)


def schedule_accepts(schedule: str | None, pp: int, m: int) -> bool:
    """torch's constraints on the micro-batch count of a schedule."""
    if schedule is None:
        return True
    if schedule == "1f1b":
        return m >= pp
    if schedule in ("interleaved", "zero-bubble"):
        return m % max(1, m // pp) == 0
    return True
