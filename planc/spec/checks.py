"""Cross-field checks of a built ``Plan``: an ordered tuple of small pure passes.

Each pass takes the plan and returns the issues it finds (empty when all is well). Field-level
rules (types, ranges, enums) live on the pydantic models; these catch what no single field can:
the model's own shape, and the layout rules of :mod:`planc.legality` applied to the keys the
plan fixes (the planner applies the same rules to the keys it chooses).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import PurePosixPath, PureWindowsPath

from planc.legality import rules
from planc.legality.rules import AUTO, Violation, divisors, fixed, near_divisor
from planc.legality.space import why_no_layout
from planc.spec.issues import SpecIssue
from planc.spec.model import ModelSpec
from planc.spec.plan import Plan
from planc.spec.plausible import check_hardware_ranges
from planc.weights.plan_checks import check_pretrained_weights

Check = Callable[[Plan], Iterable[SpecIssue]]


def _issues(*violations: Violation | None) -> list[SpecIssue]:
    return [SpecIssue(v.path, v.message, v.hint) for v in violations if v is not None]


def check_attention_shape(plan: Plan) -> Iterable[SpecIssue]:
    m = plan.model
    if m.hidden % m.heads:
        yield _heads_issue(m)
    if m.heads % m.kv_heads:
        yield SpecIssue(
            ("model", "kv_heads"),
            f"kv_heads = {m.kv_heads} does not divide heads = {m.heads}",
            f"grouped-query attention shares each KV head among heads / kv_heads query heads; "
            f"use a divisor of {m.heads}, e.g. {near_divisor(m.heads, m.kv_heads)}",
            related=(("model", "heads"),),
        )
    if m.position == "rope" and m.hidden % m.heads == 0 and m.head_dim % 2:
        yield SpecIssue(
            ("model", "position"),
            f"rope needs an even head size, but hidden / heads = {m.head_dim}",
            "change hidden or heads, or use position = learned",
            related=(("model", "hidden"), ("model", "heads")),
        )


def _heads_issue(m: ModelSpec) -> SpecIssue:
    """heads does not divide hidden: the nearest heads that meets every attention rule at once, or,
    when none does, that hidden is the key to change (and a hidden that keeps the plan's heads)."""
    message = f"heads = {m.heads} does not divide hidden = {m.hidden}"
    legal = legal_heads(m)
    if legal:
        best = min(legal, key=lambda d: (abs(d - m.heads), d))
        mha = f"; kv_heads = {best} too if the plan sets it" if m.kv_heads == m.heads and best % m.kv_heads else ""
        hint = f"pick heads so hidden / heads is a whole head size (e.g. {best}{mha})"
        return SpecIssue(("model", "heads"), message, hint, related=(("model", "hidden"),))
    rope = m.position == "rope"
    # hidden = heads x head size, the head size even under rope: a multiple of heads (x 2).
    step = m.heads * (2 if rope else 1)
    hidden = max(step, round(m.hidden / step) * step)
    needs = (
        [f"divide hidden = {m.hidden}"]
        + ([] if m.kv_heads == m.heads else [f"be a multiple of kv_heads = {m.kv_heads}"])
        + (["leave rope an even head size"] if rope else [])
    )
    hint = (
        f"no value of heads works: it must {', '.join(needs[:-1])} and {needs[-1]}; change hidden instead, "
        f"e.g. {hidden} (heads = {m.heads} × head size {hidden // m.heads})"
    )
    return SpecIssue(("model", "hidden"), message, hint, related=(("model", "heads"),))


def legal_heads(m: ModelSpec) -> list[int]:
    """Every heads that divides hidden, that kv_heads divides, and that leaves an even head size
    under rope (so following a heads hint does not trip the next rule), ascending. With kv_heads =
    heads (multi-head attention, kv_heads's default) kv_heads changes with heads."""
    rope, kv_heads = m.position == "rope", 1 if m.kv_heads == m.heads else m.kv_heads
    return [d for d in divisors(m.hidden) if d % kv_heads == 0 and not (rope and (m.hidden // d) % 2)]


def check_tensor_parallel(plan: Plan) -> Iterable[SpecIssue]:
    tp = plan.layout.tp
    if not fixed(tp):
        return []
    return _issues(
        rules.first(
            [
                rules.tensor_parallel_split(plan.model, tp, plan.hardware.per_node),
                rules.tensor_parallel_in_node(plan.hardware.per_node, tp, plan.model),
            ]
        )
    )


def check_pipeline(plan: Plan) -> Iterable[SpecIssue]:
    lay, layers = plan.layout, plan.model.layers
    pp, v, schedule = lay.pp, lay.virtual_stages, lay.schedule
    found: list[Violation | None] = []
    if fixed(pp):
        found.append(rules.pipeline_depth(layers, pp, _pipeline_devices(plan)))
        if fixed(v):
            found.append(rules.virtual_stage_depth(layers, pp, v))
        if fixed(schedule):
            found.append(rules.schedule_needs_stages(schedule, pp))
        if fixed(v):
            found.append(rules.virtual_stages_need_stages(v, pp))
    if fixed(schedule) and fixed(v):
        found.append(rules.schedule_stages_per_rank(schedule, v))
    if fixed(schedule) and fixed(lay.recompute):
        found.append(rules.zero_bubble_with_recompute(schedule, lay.recompute))
    return _issues(*found)


def _pipeline_devices(plan: Plan) -> int:
    """The devices pp must divide: the device count over the fixed tp and dp (each that divides
    it; one that does not is its own error)."""
    devices = plan.world_size
    for degree in (plan.layout.tp, plan.layout.dp):
        if fixed(degree) and devices % degree == 0:
            devices //= degree
    return devices


#: 2**18 devices: beyond the largest clusters built (about 100,000 GPUs in 2025); the cost model
#: holds one graph node per device.
MAX_DEVICES = 2**18


def check_world_size(plan: Plan) -> Iterable[SpecIssue]:
    lay, hw = plan.layout, plan.hardware
    if plan.world_size > MAX_DEVICES:
        return [
            SpecIssue(
                ("hardware", "nodes"),
                f"nodes x per_node = {hw.nodes} x {hw.per_node} = {plan.world_size} devices, "
                f"more than planc models ({MAX_DEVICES:,})",
                "check nodes and per_node for a typo",
            )
        ]
    return _issues(rules.device_count(lay.tp, lay.pp, lay.dp, hw.nodes, hw.per_node))


def check_batch(plan: Plan) -> Iterable[SpecIssue]:
    tr, lay = plan.train, plan.layout
    micro_batch = tr.micro_batch if fixed(tr.micro_batch) else None
    return _issues(
        rules.micro_batch_size(tr.global_batch, micro_batch) if micro_batch is not None else None,
        rules.batch_split(tr.global_batch, lay.dp, micro_batch) if fixed(lay.dp) else None,
    )


def check_sequence_parallel(plan: Plan) -> Iterable[SpecIssue]:
    lay = plan.layout
    if lay.sequence_parallel is not True or not fixed(lay.tp):
        return []
    return _issues(rules.sequence_parallel(plan.model, lay.tp, True))


def check_shard_group(plan: Plan) -> Iterable[SpecIssue]:
    """A fixed HSDP group (``shard_group = N``) is taken as written, so dp and zero must be fixed
    beside it; ``auto`` leaves plain FSDP or HSDP to the planner (it needs nothing else)."""
    lay = plan.layout
    if lay.shard_group is None or lay.shard_group == AUTO:
        return []
    if not (fixed(lay.dp) and fixed(lay.zero)):
        return [
            SpecIssue(
                ("layout", "shard_group"),
                "a fixed shard_group needs dp and zero fixed (the planner searches only one node per group)",
                "set dp and zero = 3 beside shard_group, or write shard_group = auto",
            )
        ]
    return _issues(rules.hybrid_shard_group(lay.shard_group, lay.dp, lay.zero, lay.tp, lay.pp))


def check_learning_rate(plan: Plan) -> Iterable[SpecIssue]:
    tr = plan.train
    if tr.min_lr > tr.lr:
        yield SpecIssue(
            ("train", "min_lr"),
            f"min_lr = {tr.min_lr} is above lr = {tr.lr}",
            "the cosine schedule decays from lr down to min_lr",
        )
    if tr.warmup_steps > tr.steps:
        yield SpecIssue(
            ("train", "warmup_steps"),
            f"warmup_steps = {tr.warmup_steps} exceeds steps = {tr.steps}",
            "warmup is part of the run; lower it",
        )


def check_checkpoint(plan: Plan) -> Iterable[SpecIssue]:
    ck = plan.checkpoint
    if ck is not None and not ck.dir.strip():
        yield SpecIssue(("checkpoint", "dir"), "checkpoint dir is empty", 'give a directory, e.g. dir = "checkpoints"')
    elif ck is not None and escapes_run_dir(ck.dir):
        # The run directory owns its checkpoints: `planc run --fresh` clears them, and a run resumes from
        # whatever step-N it finds there. A folder outside it would be shared with other runs, or be a
        # folder `--fresh` was never meant to touch.
        yield SpecIssue(
            ("checkpoint", "dir"),
            f'checkpoint dir "{ck.dir}" is outside the run directory (dir is relative to the run directory)',
            'give a path inside it, e.g. dir = "checkpoints"; to keep checkpoints on another file system, '
            "make `--out` a directory there (or link the checkpoints folder to it)",
        )


def escapes_run_dir(directory: str) -> bool:
    """Whether ``directory``, taken relative to a run directory, leaves it (absolute, or ``..`` past its top)."""
    path = PurePosixPath(directory.replace("\\", "/"))
    if path.is_absolute() or PureWindowsPath(directory).drive:
        return True
    depth = 0
    for part in path.parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return True
    return False


#: The passes, in order. A new rule is a new function appended here.
def check_precision_on_device(plan: Plan) -> Iterable[SpecIssue]:
    """bf16 on a device without bf16 arithmetic (V100) would be emulated in fp32 -- many times slower
    than the peak the plan is costed at -- so it is refused rather than planned silently."""
    hardware = plan.hardware
    if plan.train.precision == "bf16" and not hardware.bf16:
        yield SpecIssue(
            ("train", "precision"),
            f"{hardware.device} has no bf16 arithmetic (its tensor cores take fp16 only), "
            "so bf16 matmuls would run without tensor cores, far below the peak planc would cost them at",
            "set `precision = fp32` (planc has no fp16 with loss scaling yet), or use a device with bf16 "
            "(A100, H100, ...); if your device does compute bf16, say so with `hardware { bf16 = true }`",
        )


CHECKS: tuple[Check, ...] = (
    check_attention_shape,
    check_tensor_parallel,
    check_pipeline,
    check_world_size,
    check_batch,
    check_sequence_parallel,
    check_shard_group,
    check_learning_rate,
    check_precision_on_device,
    check_hardware_ranges,
    check_checkpoint,
    check_pretrained_weights,
)


def check_some_layout_exists(plan: Plan) -> Iterable[SpecIssue]:
    """Whether the fixed keys, the batch and the device count leave any layout at all (the
    planner's search space, :mod:`planc.legality.space`; no layout is scored)."""
    return _issues(why_no_layout(plan))


def run_checks(plan: Plan) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    for check in CHECKS:
        issues.extend(check(plan))
    if not issues:  # the search space is only meaningful for an otherwise valid plan
        issues.extend(check_some_layout_exists(plan))
    return issues
