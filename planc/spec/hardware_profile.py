"""A hardware profile: what ``planc calibrate`` measured on a machine, as a versioned JSON file.

A plan names one with ``hardware { profile = "cluster.json" }`` (relative to the .plan file, like
data paths); the cost model then prices GEMMs, attention, memory-bound kernels, eager dispatch
and collectives at the measured rates instead of the data-sheet defaults (docs/calibrate.md).

This module is the schema (one source of truth for the writer, ``planc.calibrate``, and the
reader, :func:`load_profile`) and the mapping from a profile to the ``hardware`` keys it sets.
It imports no torch: ``planc explain`` reads profiles.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from planc.spec.hardware import HardwareSpec
    from planc.spec.plan import Plan

#: Bump when a field changes meaning; readers refuse other versions with a clear message.
SCHEMA_VERSION = 1

_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


#: How planc's model runs its ops: fp32, bf16 parameters (FSDP2's and ``replicate``'s mixed
#: precision), bf16 autocast over fp32 parameters (planc's other bf16 programs).
OpMode = Literal["fp32", "bf16", "autocast"]
#: (compute, residual) bytes per element of each mode, as the cost model prices it.
MODE_BYTES: dict[OpMode, tuple[int, int]] = {"fp32": (4, 4), "bf16": (2, 2), "autocast": (2, 4)}


def op_mode(compute_bytes: int, residual_bytes: int) -> OpMode:
    """The mode of a plan computing in ``compute_bytes`` over a ``residual_bytes`` residual stream."""
    if compute_bytes != 2:
        return "fp32"
    return "autocast" if residual_bytes == 4 else "bf16"


class OpCost(BaseModel):
    """Seconds per eager op of planc's models whose activations have ``elements`` elements per op
    (micro-batch tokens x hidden / tp), beyond the kernels the cost model prices: in fp32, and per
    fp32 op (the cost model counts ops in fp32) under bf16 parameters and under autocast, whose
    casts and slower small kernels cost more (0: not measured)."""

    model_config = _FROZEN
    elements: float = Field(gt=0)
    seconds: float = Field(ge=0)
    seconds_bf16: float = Field(default=0.0, ge=0)
    seconds_autocast: float = Field(default=0.0, ge=0)

    def in_mode(self, mode: OpMode) -> float:
        return {"fp32": self.seconds, "bf16": self.seconds_bf16, "autocast": self.seconds_autocast}[mode]


def interpolate_op_cost(points: tuple[OpCost, ...], elements: float, mode: OpMode = "fp32") -> float:
    """Seconds per op in ``mode`` at ``elements``: linear between ``points`` (sorted by size), flat
    beyond them."""
    ordered = sorted(points, key=lambda p: p.elements)
    if elements <= ordered[0].elements:
        return ordered[0].in_mode(mode)
    for low, high in zip(ordered, ordered[1:]):
        if elements <= high.elements:
            weight = (elements - low.elements) / (high.elements - low.elements)
            return low.in_mode(mode) + weight * (high.in_mode(mode) - low.in_mode(mode))
    return ordered[-1].in_mode(mode)


class GemmRate(BaseModel):
    """One GEMM shape, (m x k) @ (k x n), and the FLOP/s it sustained."""

    model_config = _FROZEN
    m: int = Field(gt=0)
    k: int = Field(gt=0)
    n: int = Field(gt=0)
    dtype: Literal["fp32", "bf16"]
    flops: float = Field(gt=0)
    """2 m k n / median seconds."""


class AttentionRate(BaseModel):
    """Causal ``scaled_dot_product_attention`` at one shape: forward and backward FLOP/s."""

    model_config = _FROZEN
    batch: int = Field(gt=0)
    heads: int = Field(gt=0)
    seq_len: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    dtype: Literal["fp32", "bf16"]
    forward_flops: float = Field(gt=0)
    """The cost model's causal count, 4 b s^2 a d / 2, over the median forward seconds."""
    backward_flops: float = Field(gt=0)
    """2.5 x the forward count (Dao 2023) over the median backward seconds."""


class CollectiveFit(BaseModel):
    """Alpha-beta fit of one collective kind over one process group, in the cost model's terms."""

    model_config = _FROZEN
    kind: Literal["all_reduce", "all_gather", "reduce_scatter", "send_recv", "broadcast", "all_to_all"]
    group_size: int = Field(gt=1)
    medium: Literal["intra_node", "inter_node"]
    latency: float = Field(ge=0)
    """alpha, seconds per message step."""
    bandwidth: float = Field(gt=0)
    """beta, bytes/s per rank, one direction (the ring formulas of planc.cost.comm)."""
    points: list[tuple[float, float]]
    """(buffer bytes, median seconds) measured."""
    problem: str | None = None
    """Why the points identify no latency and bandwidth (planc.calibrate.collectives.fit_problem); such
    a fit is kept for inspection, but the cost model prices its kind with the data sheet."""


class CollectiveRate(BaseModel):
    """A :class:`CollectiveFit` without its points: what the cost model prices a collective with."""

    model_config = _FROZEN
    kind: Literal["all_reduce", "all_gather", "reduce_scatter", "send_recv", "broadcast", "all_to_all"]
    medium: Literal["intra_node", "inter_node"]
    latency: float = Field(ge=0)
    bandwidth: float = Field(gt=0)


class WrapperOverheads(BaseModel):
    """Host seconds each strategy's PyTorch wrapper adds beyond the plain model's eager ops and
    beyond the collectives the cost model prices on their own (``planc.calibrate.wrappers``
    measures them on small real runs of the wrappers; every field is 0 in a profile that predates
    them, so the cost model adds nothing there)."""

    model_config = _FROZEN
    ddp_per_tensor: float = Field(default=0.0, ge=0)
    """``DistributedDataParallel``: autograd hook, bucket copy and reducer bookkeeping of one
    parameter tensor, per step (micro-batches under ``no_sync`` skip the reducer)."""
    replicate_per_unit: float = Field(default=0.0, ge=0)
    """FSDP2's ``replicate`` (bf16 data parallelism): one unit's hooks and copies, per micro-batch."""
    fsdp_per_unit: float = Field(default=0.0, ge=0)
    """FSDP2 ``fully_shard``: one unit's pre/post forward and backward hooks, all-gather copy-in/out
    and reduce-scatter copy-in/out, per micro-batch (forward and backward together)."""
    tp_per_block: float = Field(default=0.0, ge=0)
    """DTensor tensor parallelism (planc's block plan, no sequence parallelism): one block's DTensor
    dispatch, sharding propagation and redistributions, per micro-batch (forward and backward)."""
    tp_sp_per_block: float = Field(default=0.0, ge=0)
    """The same with sequence parallelism (the norms and the gathers around them on DTensors too)."""
    pp_per_action: float = Field(default=0.0, ge=0)
    """``torch.distributed.pipelining``: one schedule action (one stage's forward or backward of
    one micro-batch) with its send/receive bookkeeping."""
    checkpoint_per_block: float = Field(default=0.0, ge=0)
    """Full recomputation: ``checkpoint_wrapper``'s own host work per block and micro-batch, beyond
    the forward it reruns (which the cost model prices); measured on one process."""
    selective_per_block: float = Field(default=0.0, ge=0)
    """Selective recomputation: the same under planc's selective policy (a dispatch mode that asks
    the policy about every aten op), beyond one whole rerun forward."""
    checkpoint_per_block_autocast: float = Field(default=0.0, ge=0)
    """:attr:`checkpoint_per_block` under bf16 autocast over fp32 parameters (planc's bf16 without
    FSDP2 or ``replicate``); 0 where not measured (profiles before it): the fp32 figure is used."""
    selective_per_block_autocast: float = Field(default=0.0, ge=0)
    """:attr:`selective_per_block` under autocast; 0 where not measured."""
    split_backward_per_block: float = Field(default=0.0, ge=0)
    """Zero-bubble's split backward (input gradients, then weight gradients from one root per
    parameter group): its host work per block and micro-batch beyond one whole backward, on
    planc's GPT block (8 parameter groups); measured on one process."""
    clip_per_tensor: float = Field(default=0.0, ge=0)
    """Gradient clipping (planc's norm and rescale, ``foreach`` ops) per parameter tensor per step,
    beyond the ops a step runs once: a CPU's ``foreach`` ops loop over the tensors; measured on
    one process (:mod:`planc.calibrate.step_tensors`); 0 where not measured (profiles before
    2026-11-29)."""
    optimizer_per_tensor: float = Field(default=0.0, ge=0)
    """The same for planc's (fused) AdamW step, per tensor the rank steps."""
    dtensor_optimizer_per_tensor: float = Field(default=0.0, ge=0)
    """Gradient clipping and the optimizer step of one parameter tensor that is a DTensor (FSDP2's
    ``fully_shard`` and ``replicate``, tensor parallelism), beyond the same on a plain tensor, per
    step: their ops go through DTensor's dispatch. Profiles written before 2026-11-29 measured the
    optimizer alone (and before the fused optimizer on CPU, its loop of ~9 ops per tensor)."""


class MeasuredRates(BaseModel):
    """Everything measured that has no data-sheet key of its own in ``hardware``."""

    model_config = _FROZEN
    gemm: tuple[GemmRate, ...] = ()
    attention: tuple[AttentionRate, ...] = ()
    memory_bandwidth: float | None = Field(default=None, gt=0)
    """Sustained streaming bandwidth, bytes read + written per second (no further efficiency)."""
    measured_on: str = ""
    """Where and when: device, processes, backend, date, torch version (filled when a plan reads the profile)."""
    seconds_per_op: float = Field(default=0.0, ge=0)
    """Host overhead of one eager aten op (dispatch, autograd, launch), forward and backward
    alike, where :attr:`op_costs` does not say more (the ops a step runs once, profiles without
    it): the smallest size's figure. Profiles written before 2026-11-29 timed a chain of
    elementwise multiplies, about half of what planc's ops cost (planc.calibrate.dispatch)."""
    op_costs: tuple[OpCost, ...] = ()
    """What one of planc's model ops costs beyond the kernels the cost model prices, at the sizes
    measured, in fp32 and per fp32 op in the two bf16 modes (planc's GPT and Llama at small sizes,
    forward + backward): on a CPU small ops cost more the larger their tensors, more than memory
    bandwidth says, and a bf16 op more than an fp32 one (planc.calibrate.dispatch). Interpolated
    between the points, the end points' beyond them."""
    bf16_host_factor: float = Field(default=1.0, gt=0)
    """How much longer planc's ops take with bf16 parameters (FSDP2's and ``replicate``'s mixed
    precision) than in fp32, at the calibration's larger size: the factor on the eager ops' host
    time of a bf16 plan where :attr:`op_costs` has no bf16 figure (profiles written before
    2026-11-29 measured it on one GPT block; 1 where not measured)."""
    autocast_host_factor: float = Field(default=1.0, gt=0)
    """The same under ``torch.autocast`` to bf16 over fp32 parameters (the bf16 of planc's other
    programs: the casts are ops of their own)."""
    wrappers: WrapperOverheads = WrapperOverheads()
    """What the strategies' wrappers add per unit of their own (0 without a multi-process calibration)."""
    collectives: tuple[CollectiveRate, ...] = ()
    """The profile's collective fits, every kind (filled when a plan reads the profile): the links
    take the all-reduce's as their latency and bandwidth, and each other kind prices with its own
    (:meth:`planc.hardware.topology.GroupLink.alpha_beta`)."""


class HardwareProfile(BaseModel):
    """The file ``planc calibrate`` writes."""

    model_config = _FROZEN
    schema_version: int
    planc_version: str
    torch_version: str
    created: str
    """UTC time the measurement finished, ISO 8601."""
    host: str
    backend: Literal["gloo", "nccl"]
    device_kind: Literal["cpu", "cuda"]
    device_name: str
    """torch.cuda.get_device_name(), or the CPU model."""
    world_size: int = Field(gt=0)
    nodes: int = Field(gt=0)
    per_node: int = Field(gt=0)
    threads: int = Field(gt=0)
    """torch.get_num_threads() in each process while measuring (CPU compute shares the cores)."""
    measured: MeasuredRates
    collectives: tuple[CollectiveFit, ...] = ()
    notes: tuple[str, ...] = ()
    """What a reader of the numbers should know (a collective priced with the data sheet, and why);
    `planc check` and `planc explain` show them for a plan that names the profile."""


class ProfileError(ValueError):
    """A profile file that is missing, unreadable, of another version, or invalid."""


def load_profile(path: Path) -> HardwareProfile:
    """Read and validate a profile; :class:`ProfileError` says what is wrong with it."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ProfileError(f"hardware profile {str(path)!r} does not exist") from None
    except OSError as error:
        raise ProfileError(f"cannot read hardware profile {str(path)!r}: {error.strerror}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise ProfileError(f"hardware profile {str(path)!r} is not valid JSON: {_json_syntax(error)}") from None
    if not isinstance(raw, dict):
        raise ProfileError(
            f"hardware profile {str(path)!r} holds a JSON {_JSON_KINDS.get(type(raw), type(raw).__name__)}, "
            "not an object: a profile is the JSON object `planc calibrate` writes"
        )
    if "schema_version" not in raw:
        raise ProfileError(
            f"hardware profile {str(path)!r} has no schema_version: it is not a file `planc calibrate` wrote"
        )
    version = raw["schema_version"]
    if version != SCHEMA_VERSION:
        raise ProfileError(
            f"hardware profile {str(path)!r} has schema_version {version!r}; this planc reads {SCHEMA_VERSION} "
            "(run `planc calibrate` again to write a current one)"
        )
    try:
        return HardwareProfile.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProfileError(f"hardware profile {str(path)!r}: {where}: {first['msg']}") from None


#: What a JSON value that is not an object is, in JSON's words.
_JSON_KINDS = {list: "list", str: "string", int: "number", float: "number", bool: "true/false", type(None): "null"}


def _json_syntax(error: json.JSONDecodeError) -> str:
    """``'Invalid control character at line 1, column 5'``: the json module's reason, whose text
    ("...character at", "...string starting at") expects the position after it."""
    where = f"line {error.lineno}, column {error.colno}"
    return f"{error.msg} {where}" if error.msg.endswith(" at") else f"{error.msg} at {where}"


def hardware_values(profile: HardwareProfile) -> dict:
    """The ``hardware`` keys a profile sets (a plan's own keys win over these).

    Collective fits become the links' bandwidth and latency: per medium, the all-reduce fit
    (the collective data parallelism, the most common, runs) or else the first kind measured;
    the other kinds' fits ride along in ``measured.collectives`` and price their own kind.
    The measured media's link efficiencies become 1 (a fit is already what the library moves).
    Compute and memory rates go in ``measured`` and replace the data-sheet rates in the cost
    model (:func:`planc.cost.compute.device_for`). A fit with a ``problem`` is left out: its kind
    keeps the data sheet's (or another kind's measured) link.
    """
    usable = [f for f in profile.collectives if f.problem is None]
    where = (
        f"{profile.device_name}, {profile.world_size} process(es) over {profile.backend}, "
        f"{profile.created}, torch {profile.torch_version}"
    )
    values: dict = {
        "measured": profile.measured.model_copy(
            update={
                "measured_on": where,
                "collectives": tuple(
                    CollectiveRate(kind=f.kind, medium=f.medium, latency=f.latency, bandwidth=f.bandwidth)
                    for f in usable
                ),
            }
        )
    }
    for medium in ("intra_node", "inter_node"):
        fits = [f for f in usable if f.medium == medium]
        if not fits:
            continue
        fit = next((f for f in fits if f.kind == "all_reduce"), fits[0])
        values[f"{medium}_bw"] = fit.bandwidth
        values[f"{medium}_latency"] = fit.latency
        # A measured rate is what NCCL (or gloo) moved, protocol and NVLS included: no share of it
        # is lost again, and the all-reduce fit is NVLS's own where the switch reduced.
        values[f"{medium}_link_efficiency"] = 1.0
        if medium == "intra_node":
            values["nvls_all_reduce_bw"] = None
    return values


def nearest_gemm_rate(rates: tuple[GemmRate, ...], m: int, k: int, n: int, dtype: str) -> float | None:
    """The measured rate of the shape nearest (m, k, n) in log space, or None when none of ``dtype``.

    Exact shapes (what ``planc calibrate --plan`` measures) match at distance 0; others take the
    nearest measured neighbour, a stated approximation.
    """
    best, best_distance = None, math.inf
    for rate in rates:
        if rate.dtype != dtype:
            continue
        distance = abs(math.log(rate.m / m)) + abs(math.log(rate.k / k)) + abs(math.log(rate.n / n))
        if distance < best_distance:
            best, best_distance = rate.flops, distance
    return best


def nearest_attention_rates(
    rates: tuple[AttentionRate, ...], seq_len: int, head_dim: int, dtype: str
) -> tuple[float, float] | None:
    """(forward, backward) FLOP/s of the measured attention shape nearest in sequence length."""
    candidates = [r for r in rates if r.dtype == dtype] or [r for r in rates]
    if not candidates:
        return None
    best = min(candidates, key=lambda r: abs(math.log(r.seq_len / seq_len)) + abs(math.log(r.head_dim / head_dim)))
    return best.forward_flops, best.backward_flops


def written_hardware_keys(values: dict) -> set[str]:
    """The hardware keys a plan gives: ``inter_node_bw_per_node`` gives ``inter_node_bw`` too."""
    return set(values) | ({"inter_node_bw"} if "inter_node_bw_per_node" in values else set())


def profile_defaults(values: dict, base_dir: Path, issues: list, notes: list | None = None) -> dict:
    """The keys the hardware block's ``profile`` (relative to the .plan file) supplies.

    They fill what the block leaves out, before the device preset does; problems go to ``issues``
    addressed at ``hardware.profile``, and the profile's own notes to ``notes`` (the plan's notes).
    """
    from planc.spec.issues import SpecIssue

    written = values.get("profile")
    if written is None:
        return {}
    if not isinstance(written, str):
        issues.append(SpecIssue(("hardware", "profile"), "profile must be a file name in quotes", _PROFILE_HINT))
        return {}
    path = Path(written)
    if not path.is_absolute():
        path = base_dir / path
    try:
        profile = load_profile(path)
    except ProfileError as error:
        issues.append(SpecIssue(("hardware", "profile"), str(error), _PROFILE_HINT))
        return {}
    device = values.get("device")
    if isinstance(device, str) and (device == "cpu") != (profile.device_kind == "cpu"):
        issues.append(
            SpecIssue(
                ("hardware", "profile"),
                f"profile {written!r} was measured on {profile.device_kind} ({profile.device_name}), "
                f"but the plan's device is {device!r}",
                "run `planc calibrate` on the plan's hardware, or name a profile measured there",
            )
        )
        return {}
    if notes is not None:
        notes.extend(f"profile {written}: {note}" for note in profile.notes)
    written = written_hardware_keys(values)
    measured = {k: v for k, v in hardware_values(profile).items() if k not in written}
    for medium, follows in (("intra_node", ("nvls_all_reduce_bw",)), ("inter_node", ())):
        if f"{medium}_bw" in written:  # the plan's own (line) rate keeps the data sheet's share of it
            for key in (f"{medium}_link_efficiency", *follows):
                measured.pop(key, None)
    return measured


def process_count_note(hardware: HardwareSpec, base_dir: Path) -> str | None:
    """A note when the plan runs another number of processes per node, or of nodes, than its profile
    was measured with (None when they agree, or when the profile cannot be read: that is an error
    reported at ``hardware.profile`` already).

    The measured rates are per process and depend on how many processes share a machine: CPU
    processes share the cores (GEMM, memory bandwidth, seconds per op), a node's GPUs share its links,
    and each collective fit is of the group size it ran at. A profile of 2 processes prices a
    4-process plan at rates 4 processes do not get (docs/calibrate.md, "Limits").
    """
    written = hardware.profile
    if written is None:
        return None
    path = Path(written)
    try:
        profile = load_profile(path if path.is_absolute() else base_dir / path)
    except ProfileError:
        return None
    if (profile.nodes, profile.per_node) == (hardware.nodes, hardware.per_node):
        return None
    nodes = f" on {profile.nodes} node(s)" if (profile.nodes, hardware.nodes) != (1, 1) else ""
    runs = f" on {hardware.nodes} node(s)" if nodes else ""
    cpu = " --cpu" if profile.device_kind == "cpu" else ""
    again = f"`planc calibrate --nproc {hardware.per_node}{cpu}`"
    if hardware.nodes > 1:
        again += f" as the program of a {hardware.nodes}-node torchrun (docs/calibrate.md, Across nodes)"
    return (
        f"profile {written}: measured with {profile.per_node} process(es) per node{nodes}, but the plan runs "
        f"{hardware.per_node}{runs}: its rates are those of {profile.per_node} process(es) sharing a node, so "
        f"the predictions may be off by more than their band; calibrate as the plan runs: {again}"
    )


def with_process_count_note(plan: Plan, base_dir: Path) -> Plan:
    """``plan`` with :func:`process_count_note`'s note added to its notes, when there is one."""
    note = process_count_note(plan.hardware, base_dir)
    return plan.model_copy(update={"notes": plan.notes + (note,)}) if note else plan


def fit_notes(fits) -> list[str]:
    """One note per collective fit that has a problem: what was wrong, and what prices that kind instead."""
    return [
        f"{f.kind} over {f.group_size} ranks ({f.medium}) was not fitted: {f.problem}; its collectives are priced "
        f"with the data sheet's {f.medium}_bw and {f.medium}_latency (or another kind's fit) instead. Run "
        "`planc calibrate` without --quick, or on a quieter machine, to measure it"
        for f in fits
        if f.problem
    ]


_PROFILE_HINT = (
    'write `planc calibrate --out cluster.json` on the cluster, then profile = "cluster.json" '
    "(a path relative to the .plan file)"
)
