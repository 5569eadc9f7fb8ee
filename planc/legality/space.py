"""The legal values of each layout key of a plan, given what it fixes, and why a plan has none.

A key the plan fixes is the only value tried (the planner never changes it; the spec checks
already rejected impossible fixed values). For an ``auto`` key the candidates are the values
the rules of :mod:`planc.legality.rules` allow:

- tp: divisors of ``per_node`` (tensor parallelism stays inside a node) that split heads,
  kv_heads, ffn and the padded vocabulary evenly;
- pp: divisors of world / tp, at most ``layers``;
- dp: the rest, world / (tp x pp), which must divide ``global_batch``;
- zero: 0..3 when dp > 1, else 0;
- shard_group (HSDP): with zero = 3, tp = pp = 1 and dp spanning whole nodes (dp > per_node,
  per_node divides dp), plain FSDP and one node per shard group (``shard_group = per_node``:
  the parameter gathers stay on the node's NVLink, the gradients cross nodes once per replica);
  only when the plan leaves it ``auto``, or unset with dp or zero left to the planner;
- recompute: none, selective, full;
- sequence_parallel: false, and true when tp > 1 divides seq_len;
- schedule (pp > 1): 1F1B, interleaved with v in {2, 4, 8}, zero-bubble with v in {1, 2, 4, 8}
  (pp x v <= layers). GPipe is tried only when the plan asks for it: it has 1F1B's bubble and
  holds every micro-batch's activations, so 1F1B dominates it;
- micro_batch: divisors of global_batch / dp, ascending (the search stops at the first that
  does not fit: memory grows with the micro-batch);
- what a fixed key implies about an ``auto`` one: a fixed schedule or virtual_stages > 1 needs
  pp > 1, sequence_parallel = true needs tp > 1, and zero >= 1 needs dp > 1 (there is nothing to
  shard over one rank), so layouts that would silently drop the key are not tried;
- the schedule's own rules on m = global_batch / (dp x micro_batch)
  (:func:`~planc.legality.rules.micro_batch_count`), on data parallelism
  (:func:`~planc.legality.rules.zero_bubble_with_data_parallel`) and on recomputation
  (:func:`~planc.legality.rules.zero_bubble_with_recompute`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planc import stages
from planc.legality import rules
from planc.legality.rules import AUTO, DEGREES, RECOMPUTE_ORDER, VIRTUAL_STAGE_CHOICES, Violation, divisors, fixed

if TYPE_CHECKING:
    from planc.spec.layout import Recompute, Schedule, ZeroStage
    from planc.spec.plan import Plan

#: (tp, pp, dp)
Split = tuple[int, int, int]


def tp_options(plan: Plan) -> list[int]:
    tp = plan.layout.tp
    if fixed(tp):
        return [tp]
    return [d for d in divisors(plan.hardware.per_node) if rules.tensor_parallel_split(plan.model, d) is None]


def pp_options(plan: Plan, tp: int) -> list[int]:
    pp = plan.layout.pp
    if fixed(pp):
        return [pp]
    return [d for d in divisors(plan.world_size // tp) if rules.pipeline_depth(plan.model.layers, d) is None]


def device_splits(plan: Plan) -> list[Split]:
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
    it (``{"pp": "schedule"}``): a layout with that degree 1 would drop the key
    (:func:`~planc.legality.rules.schedule_needs_stages` and its kin)."""
    lay = plan.layout
    out: dict[str, str] = {}
    if lay.schedule != AUTO:
        out["pp"] = "schedule"
    elif fixed(lay.virtual_stages) and lay.virtual_stages > 1:
        out["pp"] = "virtual_stages"
    if lay.sequence_parallel is True:
        out["tp"] = "sequence_parallel"
    if fixed(lay.zero) and lay.zero > 0:
        out["dp"] = "zero"
    return out


def fixed_text(plan: Plan, key: str) -> str:
    """``schedule = gpipe``, ``sequence_parallel = true``: a layout key as the plan wrote it."""
    value = getattr(plan.layout, key)
    return f"{key} = {str(value).lower() if isinstance(value, bool) else value}"


def degree_options(plan: Plan) -> list[Split]:
    """Every legal (tp, pp, dp): tp x pp x dp = world, dp divides global_batch, and no fixed key
    is dropped (see :func:`needs_more_than_one`)."""
    gb, needs = plan.train.global_batch, needs_more_than_one(plan)
    return [
        split
        for split in device_splits(plan)
        if gb % split[2] == 0 and all(degree > 1 for name, degree in zip(DEGREES, split) if name in needs)
    ]


def zero_options(plan: Plan, dp: int) -> list[ZeroStage]:
    zero = plan.layout.zero
    if fixed(zero):
        return [zero]
    return [0, 1, 2, 3] if dp > 1 else [0]


def shard_group_options(plan: Plan, tp: int, pp: int, dp: int, zero: ZeroStage) -> list[int | None]:
    """Plain FSDP (None) and, where HSDP can help, one node per shard group. A fixed shard_group is
    the only value tried (where it is legal); unset with dp and zero fixed means plain FSDP, as
    written. Other group sizes are not tried: a group of whole nodes gathers over the slow
    network like plain FSDP, and a group smaller than a node holds more state per device and sends
    a larger gradient shard across nodes."""
    sg, lay = plan.layout.shard_group, plan.layout
    if fixed(sg) and sg is not None:
        return [sg] if rules.hybrid_shard_group(sg, dp, zero, tp, pp) is None else []
    if sg is None and fixed(lay.dp) and fixed(lay.zero):
        return [None]
    per_node = plan.hardware.per_node
    if zero == 3 and tp == 1 and pp == 1 and dp > per_node > 1 and dp % per_node == 0:
        return [None, per_node]
    return [None]


def recompute_options(plan: Plan) -> list[Recompute]:
    r = plan.layout.recompute
    return [r] if r != AUTO else list(RECOMPUTE_ORDER)


def sp_options(plan: Plan, tp: int) -> list[bool]:
    if tp == 1:
        return [False]
    sp = plan.layout.sequence_parallel
    candidates = [sp] if fixed(sp) else [False, True]
    return [s for s in candidates if rules.sequence_parallel(plan.model, tp, s) is None]


def schedule_options(plan: Plan, pp: int) -> list[tuple[Schedule | None, int]]:
    """(schedule, virtual_stages) pairs for ``pp`` stages."""
    if pp == 1:
        return [(None, 1)]
    sched, v_fixed = plan.layout.schedule, plan.layout.virtual_stages
    schedules: list[Schedule] = [sched] if sched != AUTO else ["1f1b", "interleaved", "zero-bubble"]
    vs = [v_fixed] if fixed(v_fixed) else [1, *VIRTUAL_STAGE_CHOICES]
    return [
        (s, v)
        for s in schedules
        for v in vs
        if rules.schedule_stages_per_rank(s, v) is None and rules.virtual_stage_depth(plan.model.layers, pp, v) is None
    ]


def micro_batch_options(plan: Plan, dp: int) -> list[int]:
    gb, mb = plan.train.global_batch, plan.train.micro_batch
    local = gb // dp
    if fixed(mb):
        return [mb] if local % mb == 0 else []
    return divisors(local)


def schedule_composes(schedule: str | None, dp: int, zero: int) -> bool:
    """Whether the schedule works with this kind of data parallelism."""
    return rules.zero_bubble_with_data_parallel(schedule, dp, zero) is None


def recompute_composes(schedule: str | None, recompute: str) -> bool:
    """Whether the schedule runs under this recomputation (zero-bubble only without)."""
    return rules.zero_bubble_with_recompute(schedule, recompute) is None


def micro_batch_accepted(schedule: str | None, pp: int, m: int) -> bool:
    """Whether the schedule runs ``m`` micro-batches per step (torch's rules)."""
    return rules.micro_batch_count(schedule, pp, m) is None


# -- when there is none ------------------------------------------------------------------------


def why_no_layout(plan: Plan) -> Violation | None:
    """None when the plan has at least one legal layout; otherwise the first constraint that
    leaves none, addressed at the key to change. Cheap: no layout is scored."""
    world, gb, lay = plan.world_size, plan.train.global_batch, plan.layout
    splits = device_splits(plan)
    if not splits:
        return Violation(
            ("layout",),
            f"no tp x pp x dp covers the {world} devices with the fixed degrees and "
            f"tp dividing heads, kv_heads, ffn and the padded vocabulary within "
            f"per_node = {plan.hardware.per_node}",
            "set tp, pp or dp to auto, or change the device count",
        )
    for name, key in needs_more_than_one(plan).items():
        kept = [split for split in splits if split[DEGREES.index(name)] > 1]
        if not kept:
            return Violation(
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
        return Violation(
            ("train", "global_batch"),
            f"global_batch = {gb} is not divisible by any legal data-parallel degree "
            f"(dp = devices / (tp x pp) can be {shown} here)",
            f"every data-parallel rank runs whole sequences; use a multiple of {dps[0]}, "
            f"e.g. global_batch = {rules.round_up(gb, dps[0])}",
        )
    mb = plan.train.micro_batch
    if fixed(mb):
        locals_ = sorted({gb // dp for _, _, dp in splits})
        splits = [split for split in splits if micro_batch_options(plan, split[2])]
        if not splits:
            shown = " or ".join(map(str, locals_))
            return Violation(
                ("train", "micro_batch"),
                f"micro_batch = {mb} does not divide the {shown} sequences each data-parallel "
                f"rank gets per step (global_batch / dp)",
                f"use a micro_batch that divides {locals_[-1]}, or micro_batch = auto",
            )
    splits_with_schedule = [split for split in splits if schedule_options(plan, split[1])]
    if not splits_with_schedule:  # only a fixed virtual_stages can empty them (checks catch v = 1)
        v = lay.virtual_stages
        pps = sorted({pp for _, pp, _ in splits})
        return Violation(
            ("layout", "virtual_stages"),
            f"virtual_stages = {v} needs pp x {v} <= layers = {plan.model.layers}, but pp can only "
            f"be {', '.join(map(str, pps))} here",
            "each virtual stage needs at least one layer; lower virtual_stages or set it to auto",
        )
    return _why_no_combination(plan, splits_with_schedule)


def _why_no_combination(plan: Plan, splits: list[Split]) -> Violation | None:
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
                    m = stages.micro_batches(gb, dp, mb)
                    if micro_batch_accepted(schedule, pp, m):
                        return None
                    last = (schedule, pp, m, dp, mb)
    if not composed:
        return Violation(
            ("layout", "schedule"),
            f"zero-bubble with data parallelism runs only under ZeRO-2, but the plan fixes zero = {plan.layout.zero}",
            "its separate weight-gradient pass escapes DDP's and FSDP's hooks; set zero = 2 "
            "or use schedule = 1f1b or interleaved",
        )
    assert last is not None  # composed: some schedule, zero and micro-batch were tried
    schedule, pp, m, dp, mb = last
    rule = (
        f"needs at least pp = {pp} micro-batches per step"
        if m < pp and schedule in ("1f1b", "zero-bubble")
        else f"needs a micro-batch count divisible by its rounds (max(1, m // pp) with pp = {pp})"
    )
    return Violation(
        ("train", "micro_batch") if plan.train.micro_batch != AUTO else ("layout", "schedule"),
        f"schedule {schedule} {rule}, but global_batch / (dp x micro_batch) = {gb} / ({dp} x {mb}) = {m}",
        "lower micro_batch, raise global_batch, or use fewer pipeline stages",
    )
