"""Cross-field checks of a built ``Plan``: an ordered tuple of small pure passes.

Each pass takes the plan and returns the issues it finds (empty when all is well). Field-level
rules (types, ranges, enums) live on the pydantic models; these catch what no single field can:
divisibility, products, and layouts the hardware cannot host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from planc.spec.issues import SpecIssue
from planc.spec.plan import Plan
from planc.weights.plan_checks import check_pretrained_weights

Check = Callable[[Plan], Iterable[SpecIssue]]


def _fixed(value) -> bool:
    return value != "auto"


def check_attention_shape(plan: Plan) -> Iterable[SpecIssue]:
    m = plan.model
    if m.hidden % m.heads:
        yield SpecIssue(
            ("model", "heads"),
            f"heads = {m.heads} does not divide hidden = {m.hidden}",
            f"pick heads so hidden / heads is a whole head size (e.g. {_near_divisor(m.hidden, m.heads)})",
        )
    if m.heads % m.kv_heads:
        yield SpecIssue(
            ("model", "kv_heads"),
            f"kv_heads = {m.kv_heads} does not divide heads = {m.heads}",
            f"grouped-query attention shares each KV head among heads / kv_heads query heads; "
            f"use a divisor of {m.heads}, e.g. {_near_divisor(m.heads, m.kv_heads)}",
        )
    if m.position == "rope" and m.hidden % m.heads == 0 and m.head_dim % 2:
        yield SpecIssue(
            ("model", "position"),
            f"rope needs an even head size, but hidden / heads = {m.head_dim}",
            "change hidden or heads, or use position = learned",
        )


def check_tensor_parallel(plan: Plan) -> Iterable[SpecIssue]:
    tp, m = plan.layout.tp, plan.model
    if not _fixed(tp):
        return
    for key, value in (("heads", m.heads), ("kv_heads", m.kv_heads), ("ffn", m.ffn), ("padded_vocab", m.padded_vocab)):
        if value % tp:
            what = "the padded vocabulary" if key == "padded_vocab" else key
            yield SpecIssue(
                ("layout", "tp"),
                f"tp = {tp} does not divide {what} = {value}",
                f"tensor parallelism splits {what} evenly; use a tp that divides {value}, "
                f"e.g. {_near_divisor(value, tp)}",
            )
            return
    if tp > plan.hardware.per_node:
        yield SpecIssue(
            ("layout", "tp"),
            f"tp = {tp} exceeds per_node = {plan.hardware.per_node}",
            "tensor parallelism all-reduces every layer and must stay inside one node; "
            f"use tp <= {plan.hardware.per_node} and pp or dp for the rest",
        )
    elif plan.hardware.per_node % tp:
        yield SpecIssue(
            ("layout", "tp"),
            f"tp = {tp} does not divide per_node = {plan.hardware.per_node}",
            "some tensor-parallel groups would straddle two nodes and all-reduce every layer over "
            f"the network; use a divisor of {plan.hardware.per_node}, "
            f"e.g. {_near_divisor(plan.hardware.per_node, tp)}",
        )


def check_pipeline(plan: Plan) -> Iterable[SpecIssue]:
    lay, layers = plan.layout, plan.model.layers
    if _fixed(lay.pp) and lay.pp > layers:
        yield SpecIssue(
            ("layout", "pp"),
            f"pp = {lay.pp} is more pipeline stages than layers = {layers}",
            f"every stage needs at least one layer; use pp <= {layers}",
        )
    if _fixed(lay.pp) and _fixed(lay.virtual_stages) and lay.pp * lay.virtual_stages > layers:
        yield SpecIssue(
            ("layout", "virtual_stages"),
            f"pp x virtual_stages = {lay.pp} x {lay.virtual_stages} = {lay.pp * lay.virtual_stages} "
            f"chunks, but the model has only {layers} layers",
            "each virtual stage needs at least one layer; lower virtual_stages",
        )
    if _fixed(lay.pp) and lay.pp == 1:
        if _fixed(lay.schedule):
            yield SpecIssue(
                ("layout", "schedule"),
                f"schedule = {lay.schedule} needs pp > 1, but pp = 1",
                "remove the schedule or set pp to 2 or more",
            )
        if _fixed(lay.virtual_stages) and lay.virtual_stages > 1:
            yield SpecIssue(
                ("layout", "virtual_stages"),
                "virtual_stages > 1 needs pp > 1",
                "remove virtual_stages or set pp to 2 or more",
            )
    if lay.schedule == "interleaved" and lay.virtual_stages == 1:
        yield SpecIssue(
            ("layout", "virtual_stages"),
            "schedule = interleaved needs virtual_stages >= 2",
            "interleaving gives each pipeline rank v >= 2 model chunks (v = 1 is plain 1F1B); "
            "set virtual_stages = 2 or auto",
        )
    if (
        _fixed(lay.virtual_stages)
        and lay.virtual_stages > 1
        and _fixed(lay.schedule)
        and lay.schedule not in ("interleaved", "zero-bubble")
    ):
        yield SpecIssue(
            ("layout", "virtual_stages"),
            f"virtual_stages = {lay.virtual_stages} needs schedule = interleaved or zero-bubble, not {lay.schedule}",
            "set schedule = interleaved, or virtual_stages = 1",
        )


#: 2**18 devices: beyond the largest clusters built (about 100,000 GPUs in 2025); the cost model
#: holds one graph node per device.
MAX_DEVICES = 2**18


def check_world_size(plan: Plan) -> Iterable[SpecIssue]:
    lay, world = plan.layout, plan.world_size
    if world > MAX_DEVICES:
        yield SpecIssue(
            ("hardware", "nodes"),
            f"nodes x per_node = {plan.hardware.nodes} x {plan.hardware.per_node} "
            f"= {world} devices, more than planc models ({MAX_DEVICES:,})",
            "check nodes and per_node for a typo",
        )
        return
    degrees = {k: getattr(lay, k) for k in ("tp", "pp", "dp")}
    fixed = {k: v for k, v in degrees.items() if _fixed(v)}
    product = 1
    for v in fixed.values():
        product *= v
    shown = " x ".join(f"{k} {v}" for k, v in fixed.items())
    hw = f"nodes x per_node = {plan.hardware.nodes} x {plan.hardware.per_node} = {world}"
    if len(fixed) == 3 and product != world:
        yield SpecIssue(
            ("layout",),
            f"tp x pp x dp = {lay.tp} x {lay.pp} x {lay.dp} = {product}, but {hw}",
            "make the product equal the number of devices, or set one of them to auto",
        )
    elif fixed and world % product:
        yield SpecIssue(
            ("layout",),
            f"{shown} = {product} does not divide the {world} devices ({hw})",
            "the fixed degrees must divide the device count",
        )


def check_batch(plan: Plan) -> Iterable[SpecIssue]:
    tr, lay = plan.train, plan.layout
    gb = tr.global_batch
    if _fixed(tr.micro_batch) and tr.micro_batch > gb:
        yield SpecIssue(
            ("train", "micro_batch"),
            f"micro_batch = {tr.micro_batch} is larger than global_batch = {gb}",
            "a micro-batch is part of one optimizer step's batch",
        )
    if _fixed(lay.dp):
        mb = tr.micro_batch if _fixed(tr.micro_batch) else 1
        if gb % (lay.dp * mb):
            what = f"dp x micro_batch = {lay.dp} x {mb} = {lay.dp * mb}" if _fixed(tr.micro_batch) else f"dp = {lay.dp}"
            yield SpecIssue(
                ("train", "global_batch"),
                f"global_batch = {gb} is not divisible by {what}",
                f"every data-parallel rank runs whole micro-batches; use a global_batch that is a "
                f"multiple of {lay.dp * mb}, e.g. {_round_up(gb, lay.dp * mb)}",
            )


def check_sequence_parallel(plan: Plan) -> Iterable[SpecIssue]:
    lay = plan.layout
    if lay.sequence_parallel is True and _fixed(lay.tp) and lay.tp == 1:
        yield SpecIssue(
            ("layout", "sequence_parallel"),
            "sequence_parallel = true needs tp > 1",
            "sequence parallelism shards over the tensor-parallel group; set tp >= 2",
        )


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


#: The passes, in order. A new rule is a new function appended here.
CHECKS: tuple[Check, ...] = (
    check_attention_shape,
    check_tensor_parallel,
    check_pipeline,
    check_world_size,
    check_batch,
    check_sequence_parallel,
    check_learning_rate,
    check_checkpoint,
    check_pretrained_weights,
)


def check_some_layout_exists(plan: Plan) -> Iterable[SpecIssue]:
    """Whether the fixed keys, the batch and the device count leave any layout at all. The legal
    layouts are the planner's search space, so this asks it (one definition, no scoring)."""
    from planc.planner.space import why_no_layout

    issue = why_no_layout(plan)
    if issue is not None:
        yield issue


def run_checks(plan: Plan) -> list[SpecIssue]:
    issues: list[SpecIssue] = []
    for check in CHECKS:
        issues.extend(check(plan))
    if not issues:  # the search space is only meaningful for an otherwise valid plan
        issues.extend(check_some_layout_exists(plan))
    return issues


def _near_divisor(n: int, near: int) -> int:
    """The divisor of n closest to ``near`` (ties go to the smaller)."""
    divisors = [d for d in range(1, n + 1) if n % d == 0] if n < 10**6 else [1]
    return min(divisors, key=lambda d: (abs(d - near), d))


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
