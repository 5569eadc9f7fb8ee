"""The legal values of each layout key, given what the plan fixes and what divides what.

A key the plan fixes is the only value tried (the planner never changes it; the spec checks
already rejected impossible fixed values). For an ``auto`` key the candidates are:

- tp: divisors of ``per_node`` (tensor parallelism stays inside a node) that divide heads,
  kv_heads, ffn and the padded vocabulary;
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
- what a fixed key implies about an ``auto`` one: a fixed schedule or virtual_stages > 1
  needs pp > 1, sequence_parallel = true needs tp > 1, and zero >= 1 needs dp > 1 (there is
  nothing to shard over one rank), so layouts that would silently drop the key are not tried;
- the schedule's own rules on m = global_batch / (dp x micro_batch): 1F1B needs m >= pp
  (torch ``Schedule1F1B``); interleaved and zero-bubble need m divisible by max(1, m // pp)
  (torch's rounds).
"""

from __future__ import annotations

from planc.spec.issues import SpecIssue
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
    m = plan.model
    return [
        d
        for d in _divisors(plan.hardware.per_node)
        if all(x % d == 0 for x in (m.heads, m.kv_heads, m.ffn, m.padded_vocab))
    ]


def pp_options(plan: Plan, tp: int) -> list[int]:
    pp = plan.layout.pp
    if pp != AUTO:
        return [pp]
    return [d for d in _divisors(plan.world_size // tp) if d <= plan.model.layers]


def device_splits(plan: Plan) -> list[tuple[int, int, int]]:
    """Every (tp, pp, dp) with tp x pp x dp = world that the fixed degrees and the model's shape
    allow, before the batch and the other fixed keys are considered."""
    world = plan.world_size
    out = []
    for tp in tp_options(plan):
        if world % tp:
            continue
        for pp in pp_options(plan, tp):
            if (world // tp) % pp:
                continue
            dp = world // (tp * pp)
            if plan.layout.dp == AUTO or dp == plan.layout.dp:
                out.append((tp, pp, dp))
    return out


def needs_more_than_one(plan: Plan) -> dict[str, str]:
    """The degrees that other fixed keys require to be > 1, each with the layout key that requires
    it (``{"pp": "schedule"}``): a layout with that degree 1 would drop the key."""
    lay, out = plan.layout, {}
    if lay.schedule != AUTO:
        out["pp"] = "schedule"
    elif lay.virtual_stages != AUTO and lay.virtual_stages > 1:
        out["pp"] = "virtual_stages"
    if lay.sequence_parallel is True:
        out["tp"] = "sequence_parallel"
    if lay.zero != AUTO and lay.zero > 0:
        out["dp"] = "zero"
    return out


def fixed_text(plan: Plan, key: str) -> str:
    """``schedule = gpipe``, ``sequence_parallel = true``: a layout key as the plan wrote it."""
    value = getattr(plan.layout, key)
    return f"{key} = {str(value).lower() if isinstance(value, bool) else value}"


def degree_options(plan: Plan) -> list[tuple[int, int, int]]:
    """Every legal (tp, pp, dp): tp x pp x dp = world, dp divides global_batch, and no fixed key
    is dropped (see :func:`needs_more_than_one`)."""
    gb, needs = plan.train.global_batch, needs_more_than_one(plan)
    return [
        (tp, pp, dp)
        for tp, pp, dp in device_splits(plan)
        if gb % dp == 0 and all(degree > 1 for name, degree in (("tp", tp), ("pp", pp), ("dp", dp)) if name in needs)
    ]


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
    vs = [v for v in (VIRTUAL_STAGE_CHOICES if v_fixed == AUTO else [v_fixed]) if pp * v <= layers]
    out: list[tuple[str | None, int]] = []
    for s in [sched] if sched != AUTO else ["1f1b", "interleaved", "zero-bubble"]:
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


# -- when there is none ------------------------------------------------------------------------

_DEGREE_INDEX = {"tp": 0, "pp": 1, "dp": 2}


def why_no_layout(plan: Plan) -> SpecIssue | None:
    """None when the plan has at least one legal layout; otherwise the first constraint that
    leaves none, addressed at the key to change. Cheap: no layout is scored."""
    world, gb, lay = plan.world_size, plan.train.global_batch, plan.layout
    splits = device_splits(plan)
    if not splits:
        return SpecIssue(
            ("layout",),
            f"no tp x pp x dp covers the {world} devices with the fixed degrees and "
            f"tp dividing heads, kv_heads, ffn and the padded vocabulary within "
            f"per_node = {plan.hardware.per_node}",
            "set tp, pp or dp to auto, or change the device count",
        )
    for name, key in needs_more_than_one(plan).items():
        kept = [split for split in splits if split[_DEGREE_INDEX[name]] > 1]
        if not kept:
            return SpecIssue(
                ("layout", key),
                f"{fixed_text(plan, key)} needs {name} > 1, but every legal "
                f"layout of the {world} device(s) has {name} = 1",
                f"remove {key}, or change the fixed degrees or the device count so {name} can exceed 1",
            )
        splits = kept
    dps = sorted({dp for _, _, dp in splits})
    splits = [split for split in splits if gb % split[2] == 0]
    if not splits:
        shown = ", ".join(map(str, dps))
        return SpecIssue(
            ("train", "global_batch"),
            f"global_batch = {gb} is not divisible by any legal data-parallel degree "
            f"(dp = devices / (tp x pp) can be {shown} here)",
            f"every data-parallel rank runs whole sequences; use a multiple of {dps[0]}, "
            f"e.g. global_batch = {-(-gb // dps[0]) * dps[0]}",
        )
    if plan.train.micro_batch != AUTO:
        mb = plan.train.micro_batch
        locals_ = sorted({gb // dp for _, _, dp in splits})
        splits = [split for split in splits if micro_batch_options(plan, split[2])]
        if not splits:
            shown = " or ".join(map(str, locals_))
            return SpecIssue(
                ("train", "micro_batch"),
                f"micro_batch = {mb} does not divide the {shown} sequences each data-parallel "
                f"rank gets per step (global_batch / dp)",
                f"use a micro_batch that divides {locals_[-1]}, or micro_batch = auto",
            )
    splits_with_schedule = [split for split in splits if schedule_options(plan, split[1])]
    if not splits_with_schedule:  # only a fixed virtual_stages can empty them (checks catch v = 1)
        v = lay.virtual_stages
        pps = sorted({pp for _, pp, _ in splits})
        return SpecIssue(
            ("layout", "virtual_stages"),
            f"virtual_stages = {v} needs pp x {v} <= layers = {plan.model.layers}, but pp can only "
            f"be {', '.join(map(str, pps))} here",
            "each virtual stage needs at least one layer; lower virtual_stages or set it to auto",
        )
    return _why_no_combination(plan, splits_with_schedule)


def _why_no_combination(plan: Plan, splits: list[tuple[int, int, int]]) -> SpecIssue | None:
    """The schedule's own rules: zero-bubble's data parallelism, the micro-batch counts."""
    gb = plan.train.global_batch
    composed = False
    last = None
    for _tp, pp, dp in splits:
        for schedule, _ in schedule_options(plan, pp):
            for zero in zero_options(plan, dp):
                if not schedule_composes(schedule, dp, zero):
                    continue
                composed = True
                for mb in micro_batch_options(plan, dp):
                    if schedule_accepts(schedule, pp, gb // (dp * mb)):
                        return None
                    last = (schedule, pp, gb // (dp * mb), dp, mb)
    if not composed:
        return SpecIssue(
            ("layout", "schedule"),
            f"zero-bubble with data parallelism runs only under ZeRO-2, but the plan fixes zero = {plan.layout.zero}",
            "its separate weight-gradient pass escapes DDP's and FSDP's hooks; set zero = 2 "
            "or use schedule = 1f1b or interleaved",
        )
    schedule, pp, m, dp, mb = last
    rule = (
        f"needs at least pp = {pp} micro-batches per step"
        if schedule == "1f1b"
        else f"needs a micro-batch count divisible by its rounds (max(1, m // pp) with pp = {pp})"
    )
    return SpecIssue(
        ("train", "micro_batch") if plan.train.micro_batch != AUTO else ("layout", "schedule"),
        f"schedule {schedule} {rule}, but global_batch / (dp x micro_batch) = {gb} / ({dp} x {mb}) = {m}",
        "lower micro_batch, raise global_batch, or use fewer pipeline stages",
    )
