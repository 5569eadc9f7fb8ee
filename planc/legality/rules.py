"""Layout legality: every rule that says whether a layout can run, in one place.

A rule is a small pure function that returns a :class:`Violation` (the key to change, what is
wrong, what to do) or None. Everything that needs to know whether a layout is legal asks here:

- the spec checks (:mod:`planc.spec.checks`) apply the rules to the keys a plan fixes;
- :class:`~planc.spec.Layout` applies the consistency rules to a resolved layout;
- the planner enumerates the legal values of each ``auto`` key (:func:`tp_options`,
  :func:`schedule_options`, :func:`micro_batch_accepted`, ...) with the same rules;
- the built-in strategies' ``check`` hooks report the rules of their technique
  (:func:`pipeline_violations`, :func:`tensor_parallel_violations`);
- :func:`why_no_layout` says why a plan leaves no legal layout at all (``planc check``).

The stage arithmetic the rules need (chunks, rounds, placements) is :mod:`planc.stages`'s.
This module imports no other planc module at run time (the spec imports it), only types.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

from typing_extensions import TypeIs

from planc import stages
from planc.stages import StageStyle

if TYPE_CHECKING:
    from planc.spec.layout import Layout, Recompute, Schedule
    from planc.spec.model import ModelSpec
    from planc.spec.plan import Plan

AUTO: Literal["auto"] = "auto"
_T = TypeVar("_T")
RECOMPUTE_ORDER: tuple[Recompute, ...] = ("none", "selective", "full")
VIRTUAL_STAGE_CHOICES = (2, 4, 8)
#: Schedules that run several stages per pipeline rank.
MULTI_STAGE_SCHEDULES: tuple[Schedule, ...] = ("interleaved", "zero-bubble")
#: tp x pp x dp factors; which mesh dimension each index of a (tp, pp, dp) split is.
DEGREES = ("tp", "pp", "dp")


@dataclass(frozen=True)
class Violation:
    """A rule a layout breaks: the key to change (a spec path), what is wrong and what to do."""

    path: tuple[str, ...]
    message: str
    hint: str | None = None

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


def fixed(value: _T | Literal["auto"]) -> TypeIs[_T]:
    """Whether the plan fixes a key (its value is not ``auto``); narrows the value's type."""
    return value != AUTO


def first(violations: Iterable[Violation | None]) -> Violation | None:
    """The first violation of several rules (they are checked in the order given)."""
    return next((v for v in violations if v is not None), None)


# -- tensor and sequence parallelism -------------------------------------------------------------


#: What tensor parallelism splits evenly, as (model attribute, how a message names it).
TP_SPLIT_KEYS = (
    ("heads", "heads"),
    ("kv_heads", "kv_heads"),
    ("ffn", "ffn"),
    ("padded_vocab", "the padded vocabulary"),
)


def tensor_parallel_split(model: ModelSpec, tp: int, per_node: int | None = None) -> Violation | None:
    """tp splits the heads, the KV heads, the MLP width and the padded vocabulary evenly
    (Shoeybi et al. 2019, Sec. 3; grouped-query attention needs tp | kv_heads). With
    ``per_node`` the hint only suggests a tp that also stays inside a node."""
    for key, what in TP_SPLIT_KEYS:
        value = getattr(model, key)
        if value % tp:
            return Violation(
                ("layout", "tp"),
                f"tp = {tp} does not divide {what} = {value}",
                f"tensor parallelism splits {what} evenly; " + tensor_parallel_hint(model, tp, per_node),
            )
    return None


def tensor_parallel_in_node(per_node: int, tp: int, model: ModelSpec | None = None) -> Violation | None:
    """A tensor-parallel group stays inside one node (it all-reduces every layer)."""
    if tp > per_node:
        return Violation(
            ("layout", "tp"),
            f"tp = {tp} exceeds per_node = {per_node}",
            "tensor parallelism all-reduces every layer and must stay inside one node; "
            + (tensor_parallel_hint(model, tp, per_node) if model else f"use tp <= {per_node}")
            + ", and pp or dp for the rest",
        )
    if per_node % tp:
        return Violation(
            ("layout", "tp"),
            f"tp = {tp} does not divide per_node = {per_node}",
            "some tensor-parallel groups would straddle two nodes and all-reduce every layer over the network; "
            + (tensor_parallel_hint(model, tp, per_node) if model else f"use a divisor of {per_node}"),
        )
    return None


def tensor_parallel_degrees(model: ModelSpec, per_node: int | None = None) -> list[int]:
    """Every tp that splits the model evenly (and divides ``per_node`` when given), ascending."""
    common = math.gcd(*(getattr(model, key) for key, _ in TP_SPLIT_KEYS))
    return divisors(math.gcd(common, per_node) if per_node else common)


def tensor_parallel_hint(model: ModelSpec, tp: int, per_node: int | None) -> str:
    """What tp to use instead of ``tp``: the nearest value that meets every tensor-parallel rule at
    once (so following the hint never leads to another tp error), or, when only tp = 1 does,
    which keys rule the others out and what to change instead."""
    legal = [d for d in tensor_parallel_degrees(model, per_node) if d > 1]
    within = f" and per_node = {per_node}" if per_node else ""
    if legal:
        best = min(legal, key=lambda d: (abs(d - tp), d))
        others = [str(d) for d in legal if d != best]
        also = f" (so do{'es' if len(others) == 1 else ''} {', '.join(others)})" if others else ""
        return f"use tp = {best}, which divides heads, kv_heads, ffn, the padded vocabulary{within}{also}"
    blockers = [
        f"{what} = {getattr(model, key)}"
        for key, what in TP_SPLIT_KEYS
        if per_node is None or math.gcd(getattr(model, key), per_node) == 1
    ] or [f"{w} = {getattr(model, k)}" for k, w in TP_SPLIT_KEYS]
    return (
        f"no tp > 1 divides {', '.join(blockers)}{within}, so this model cannot use tensor parallelism here: "
        "remove tp (or set tp = 1) and let pp and dp cover the devices, or change "
        + " or ".join(b.split(" = ")[0] for b in blockers)
    )


def sequence_parallel(model: ModelSpec, tp: int, sp: bool) -> Violation | None:
    """Sequence parallelism shards the sequence over the tensor-parallel group (Korthikanti et
    al. 2022, Sec. 4.2.2): it needs tp > 1 and tp | seq_len."""
    if not sp:
        return None
    if tp == 1:
        return Violation(
            ("layout", "sequence_parallel"),
            "sequence_parallel = true needs tp > 1",
            "sequence parallelism shards over the tensor-parallel group; set tp >= 2",
        )
    if model.seq_len % tp:
        return Violation(
            ("layout", "sequence_parallel"),
            f"sequence parallelism splits seq_len = {model.seq_len} over tp = {tp}, which does not divide it",
            "turn sequence_parallel off or pick a tp that divides seq_len",
        )
    return None


# -- pipeline parallelism ------------------------------------------------------------------------


def pipeline_depth(layers: int, pp: int, devices: int | None = None) -> Violation | None:
    """Every pipeline stage holds at least one block: pp <= layers. With ``devices`` (what the
    pipeline's ranks must divide: the device count over the fixed tp and dp) the hint only
    suggests a pp that also divides them."""
    if pp > layers:
        return Violation(
            ("layout", "pp"),
            f"pp = {pp} is more pipeline stages than layers = {layers}",
            "every stage needs at least one layer; " + pipeline_hint(layers, pp, devices),
        )
    return None


def pipeline_hint(layers: int, pp: int, devices: int | None) -> str:
    """What pp to use instead of ``pp``: the nearest value that is at most ``layers`` and divides
    ``devices`` (so following the hint never leads to another pp error), as the tp hint does; when
    only pp = 1 does, say so."""
    if devices is None:
        return f"use pp <= {layers}"
    legal = [d for d in divisors(devices) if 1 < d <= layers]
    if not legal:
        return (
            f"no pp > 1 divides the {devices} devices and is at most layers = {layers}: "
            "remove pp (or set pp = 1), or change the device count"
        )
    best = min(legal, key=lambda d: (abs(d - pp), d))
    others = [str(d) for d in legal if d != best]
    also = f" (so do{'es' if len(others) == 1 else ''} {', '.join(others)})" if others else ""
    return f"use pp = {best}, which divides the {devices} devices and is at most layers = {layers}{also}"


def virtual_stage_depth(layers: int, pp: int, v: int) -> Violation | None:
    """Every virtual stage holds at least one block: pp x v <= layers."""
    if pp * v > layers:
        return Violation(
            ("layout", "virtual_stages"),
            f"pp x virtual_stages = {pp} x {v} = {pp * v} chunks, but the model has only {layers} layers",
            "each virtual stage needs at least one layer; lower virtual_stages",
        )
    return None


def schedule_needs_stages(schedule: str | None, pp: int) -> Violation | None:
    """A pipeline schedule, and virtual stages, need more than one pipeline stage."""
    if schedule is not None and pp == 1:
        return Violation(
            ("layout", "schedule"),
            f"schedule = {schedule} needs pp > 1, but pp = 1",
            "remove the schedule or set pp to 2 or more",
        )
    return None


def hybrid_shard_group(
    shard_group: int | None, dp: int, zero: object, tp: object = 1, pp: object = 1
) -> Violation | None:
    """HSDP shards ZeRO-2/3 states over groups of ``shard_group`` dp ranks, replicated across
    ``dp / shard_group`` groups: the group must divide dp, leave at least two replicas, and there
    must be sharded states (zero 2 or 3). Pure data parallelism only for now: with tp or pp the
    2-D mesh has never been tested against the one-process reference."""
    if shard_group is None:
        return None
    where = ("layout", "shard_group")
    if tp != 1 or pp != 1:
        return Violation(
            where,
            "shard_group (HSDP) is supported only with tp = 1 and pp = 1 so far",
            "set tp = 1 and pp = 1, or remove shard_group",
        )
    if zero in (0, 1):
        return Violation(
            where, f"shard_group needs zero = 2 or 3 (FSDP), not zero = {zero}", "set zero = 3 or remove shard_group"
        )
    if dp == 1 or dp % shard_group or shard_group >= dp:
        groups = [g for g in range(1, dp) if dp % g == 0 and g > 1]
        hint = f"use one of {groups}" if groups else "remove shard_group (it needs dp of at least 4)"
        return Violation(where, f"shard_group = {shard_group} must divide dp = {dp} and be less than it", hint)
    return None


def virtual_stages_need_stages(v: int, pp: int) -> Violation | None:
    if v > 1 and pp == 1:
        return Violation(
            ("layout", "virtual_stages"),
            "virtual_stages > 1 needs pp > 1",
            "remove virtual_stages or set pp to 2 or more",
        )
    return None


def schedule_stages_per_rank(schedule: str, v: int) -> Violation | None:
    """Interleaving needs v >= 2 stages per rank; GPipe and 1F1B run exactly one."""
    if schedule == "interleaved" and v == 1:
        return Violation(
            ("layout", "virtual_stages"),
            "schedule = interleaved needs virtual_stages >= 2",
            "interleaving gives each pipeline rank v >= 2 model chunks (v = 1 is plain 1F1B); "
            "set virtual_stages = 2 or auto",
        )
    if v > 1 and schedule not in MULTI_STAGE_SCHEDULES:
        return Violation(
            ("layout", "virtual_stages"),
            f"virtual_stages = {v} needs schedule = interleaved or zero-bubble, not {schedule}",
            "set schedule = interleaved, or virtual_stages = 1",
        )
    return None


def micro_batch_count(schedule: str | None, pp: int, m: int, style: StageStyle = "looped") -> Violation | None:
    """torch's rules on the micro-batches per step m of a schedule.

    1F1B needs m >= pp (``Schedule1F1B``); the looped multi-stage schedules run m in
    :func:`~planc.stages.interleaved_rounds` equal rounds; zero-bubble needs m >= pp too: with
    fewer micro-batches its weight-gradient passes cannot fill the pipeline's warm-up and
    cool-down, which is the only case where planc's closed-form bubble would not be exact.
    """
    if schedule is None or style == "v":
        return None
    where = ("train", "micro_batch")
    if schedule in ("1f1b", "zero-bubble") and m < pp:
        name = "1F1B" if schedule == "1f1b" else "zero-bubble"
        return Violation(
            where,
            f"{name} needs at least as many micro-batches as stages: {m} < pp = {pp}",
            "lower micro_batch or raise global_batch",
        )
    rounds = stages.interleaved_rounds(m, pp)
    if schedule in MULTI_STAGE_SCHEDULES and m % rounds:
        return Violation(
            where,
            f"the {schedule} schedule runs micro-batches in {rounds} rounds (max(1, m // pp) with pp = {pp}); "
            f"{m} micro-batches do not split into them evenly",
            f"use a multiple of {pp} micro-batches per step",
        )
    return None


def v_shape(schedule: str | None, v: int, tie_embeddings: bool, style: StageStyle) -> Violation | None:
    """ZB-V places exactly two stages per rank, the first and the last on rank 0."""
    if style != "v":
        return None
    if v != 2:
        return Violation(
            ("layout", "virtual_stages"),
            "zero_bubble = zbv places two chunks per rank in a V",
            "set virtual_stages = 2",
        )
    if tie_embeddings:
        return Violation(
            ("uses",),
            "ZBV puts the first and the last stage on the same rank, where planc cannot keep a tied copy "
            "of the embedding",
            "use zero_bubble = interleaved, or untie the embeddings",
        )
    return None


#: Measured on torch 2.13 (tests/distributed): with DDP or ZeRO-1 the losses leave the single-process
#: reference at step 2 (|dloss| 0.04), with ZeRO-3 too (0.016); ZeRO-2 matches it to 5e-7.
ZERO_BUBBLE_DATA_PARALLEL = (
    "the zero-bubble schedules compute weight gradients in a separate pass with torch.autograd.grad, which "
    "DistributedDataParallel never sees and which FSDP only handles when parameters stay gathered"
)


def zero_bubble_with_data_parallel(schedule: str | None, dp: int, zero: int) -> Violation | None:
    """With data parallelism the zero-bubble schedules run only under ZeRO-2."""
    if schedule == "zero-bubble" and dp > 1 and zero != 2:
        return Violation(
            ("layout", "schedule"),
            ZERO_BUBBLE_DATA_PARALLEL,
            "with data parallelism use zero = 2, or the interleaved schedule",
        )
    return None


def zero_bubble_with_recompute(schedule: str | None, recompute: str) -> Violation | None:
    """The zero-bubble schedules run without activation recomputation.

    Their split backward takes input gradients, then weight gradients from one root per parameter
    group (``torch.distributed.pipelining._backward``). torch's selective checkpointing lets a
    region run backward once: a real run stops at its first step ("Trying to backward an extra
    time ... under selective activation checkpoint"; found by ``planc verify --simulate``). Plain
    checkpointing (full) runs, but the weight half reruns each block's forward once per parameter
    group and holds the reruns at once: on 4 of planc's Llama blocks, 40 block forwards rerun per
    micro-batch instead of 1F1B's 4, and a weight-half peak of 292 MiB against 85 MiB without
    recomputation (``python bench/split_backward_recompute.py``); ``planc verify --simulate`` read
    a Llama 3 70B plan's peak 38-57% above the cost model's. Both recomputations run under 1F1B
    and interleaved."""
    if schedule != "zero-bubble" or recompute == "none":
        return None
    if recompute == "selective":
        why = (
            "zero-bubble runs each block's backward twice (input, then weight gradients), which torch's "
            "selective activation checkpointing does not allow"
        )
    else:
        why = (
            "zero-bubble's weight-gradient pass reruns each checkpointed block's forward once per parameter "
            "group and holds the reruns at once: more memory than no recomputation, and ten times the rerun "
            "compute (bench/split_backward_recompute.py)"
        )
    return Violation(
        ("layout", "recompute"),
        why,
        f"use recompute = none with zero-bubble, or schedule = interleaved with recompute = {recompute}",
    )


def pipeline_violations(plan: Plan, layout: Layout, style: StageStyle) -> list[Violation]:
    """Every pipeline rule a resolved layout breaks (the ``pipeline`` strategy's check)."""
    m = stages.micro_batches(plan.train.global_batch, layout.dp, layout.micro_batch)
    found = [
        pipeline_depth(plan.model.layers, layout.pp, plan.world_size // layout.tp),
        virtual_stage_depth(plan.model.layers, layout.pp, layout.virtual_stages),
        schedule_stages_per_rank(layout.schedule or "", layout.virtual_stages) if layout.schedule else None,
        micro_batch_count(layout.schedule, layout.pp, m, style),
        v_shape(layout.schedule, layout.virtual_stages, plan.model.tie_embeddings, style),
        zero_bubble_with_data_parallel(layout.schedule, layout.dp, layout.zero),
        zero_bubble_with_recompute(layout.schedule, layout.recompute),
    ]
    return [v for v in found if v is not None]


def tensor_parallel_violations(plan: Plan, layout: Layout, sequence_parallel_on: bool) -> list[Violation]:
    """Every tensor-parallel rule a resolved layout breaks (the ``tensor_parallel`` strategy's check)."""
    found = [
        tensor_parallel_split(plan.model, layout.tp, plan.hardware.per_node),
        sequence_parallel(plan.model, layout.tp, sequence_parallel_on),
    ]
    return [v for v in found if v is not None]


# -- data parallelism, devices, batch ------------------------------------------------------------


def needs_data_parallel(technique: str, dp: int) -> Violation | None:
    """A data-parallel technique (DDP, ZeRO) needs more than one data-parallel rank."""
    if dp < 2:
        return Violation(
            ("layout", "dp"),
            f"{technique} needs more than one data-parallel rank (layout dp > 1)",
            "leave dp to the planner, or drop the technique",
        )
    return None


def device_count(tp: int | str, pp: int | str, dp: int | str, nodes: int, per_node: int) -> Violation | None:
    """The fixed degrees (``auto`` for the others) cover, or divide, the ``nodes x per_node`` devices."""
    world = nodes * per_node
    fixed = {name: value for name, value in zip(DEGREES, (tp, pp, dp)) if value != AUTO}
    product = 1
    for value in fixed.values():
        product *= int(value)
    hw = f"nodes x per_node = {nodes} x {per_node} = {world}"
    if len(fixed) == 3 and product != world:
        return Violation(
            ("layout",),
            f"tp x pp x dp = {tp} x {pp} x {dp} = {product}, but {hw}",
            "make the product equal the number of devices, or set one of them to auto",
        )
    if fixed and world % product:
        shown = " x ".join(f"{k} {v}" for k, v in fixed.items()) + f" = {product}" if len(fixed) > 1 else ""
        shown = shown or " ".join(f"{k} = {v}" for k, v in fixed.items())
        return Violation(
            ("layout",),
            f"{shown} does not divide the {world} devices ({hw})",
            "the fixed degrees must divide the device count",
        )
    return None


def micro_batch_size(global_batch: int, micro_batch: int) -> Violation | None:
    """A micro-batch is part of one optimizer step's batch."""
    if micro_batch > global_batch:
        return Violation(
            ("train", "micro_batch"),
            f"micro_batch = {micro_batch} is larger than global_batch = {global_batch}",
            "a micro-batch is part of one optimizer step's batch",
        )
    return None


def batch_split(global_batch: int, dp: int, micro_batch: int | None = None) -> Violation | None:
    """Every data-parallel rank runs whole micro-batches: dp x micro_batch divides global_batch
    (``micro_batch`` None: not fixed yet, so at least dp must divide it)."""
    mb = micro_batch or 1
    if global_batch % (dp * mb):
        what = f"dp x micro_batch = {dp} x {mb} = {dp * mb}" if micro_batch else f"dp = {dp}"
        return Violation(
            ("train", "global_batch"),
            f"global_batch = {global_batch} is not divisible by {what}",
            f"every data-parallel rank runs whole micro-batches; use a global_batch that is a "
            f"multiple of {dp * mb}, e.g. {round_up(global_batch, dp * mb)}",
        )
    return None


def resolved_layout(tp: int, pp: int, schedule: str | None, v: int, sp: bool) -> Violation | None:
    """The consistency a resolved :class:`~planc.spec.Layout` keeps by construction."""
    if (pp > 1) != (schedule is not None):
        return Violation(("layout", "schedule"), "schedule must be set exactly when pp > 1")
    if v > 1 and schedule not in MULTI_STAGE_SCHEDULES:
        return Violation(
            ("layout", "virtual_stages"), "virtual_stages > 1 needs the interleaved or zero-bubble schedule"
        )
    if sp and tp == 1:
        return Violation(("layout", "sequence_parallel"), "sequence_parallel needs tp > 1")
    return None


# -- small arithmetic for hints ------------------------------------------------------------------


def near_divisor(n: int, near: int) -> int:
    """The divisor of n closest to ``near`` (ties go to the smaller)."""
    divisors = [d for d in range(1, n + 1) if n % d == 0] if n < 10**6 else [1]
    return min(divisors, key=lambda d: (abs(d - near), d))


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]
