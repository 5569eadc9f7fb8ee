"""``planc explain``: the planner's choice in words and numbers (text and JSON).

Every number printed comes from the :class:`~planc.cost.Estimate` of the chosen layout; the
formulas behind each are in docs/cost-model.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from planc.cost.comm import switch_beats_ring
from planc.cost.context import ContextCache
from planc.cost.estimate import CommCost, Estimate
from planc.cost.flops import model_flops_per_token
from planc.cost.uncertainty import step_time_uncertainty, uncertainty_basis
from planc.explain.advice_words import advice_text
from planc.explain.memory_table import memory_dict, memory_table
from planc.explain.timeline import ascii_timeline
from planc.explain.totals import band_text, mfu_text, totals_dict, totals_line
from planc.explain.visible import visible
from planc.explain.words import layout_dict, rejection_dict, rejection_reason, suggestion_text
from planc.hardware.topology import GroupLink
from planc.planner.checked import sharded_regime, unchecked, widest_checked
from planc.planner.choose import Choice
from planc.planner.explore import Candidate
from planc.planner.ladder import rung_name
from planc.spec.hardware import HardwareSpec
from planc.spec.layout import Layout
from planc.spec.plan import Plan
from planc.stages import StageStyle
from planc.units import (
    format_bandwidth,
    format_bytes,
    format_count,
    format_seconds,
    format_signed_percent,
    format_tflops,
)

GiB = 2**30


def _medium(name: str, hw: HardwareSpec) -> str:
    """How to call a link: the topology's in-node switch link by the device's own medium
    (``hardware.intra_node_link``: NVLink, Infinity Fabric, PCIe; "intra-node" for CPU processes
    over gloo and devices nothing names)."""
    return visible(hw.intra_node_link).lower() if name == "nvlink" else name


def shown_links(plan: Plan, layout: Layout, style: StageStyle = "looped") -> dict[str, GroupLink]:
    """The links of the layout's groups as explain shows them (the pipeline's placed by ``style``):
    with HSDP the "dp" row's gathers and reduce-scatters run over the shard group (its replica
    all-reduce is named in the row's detail)."""
    links = ContextCache(plan).links(layout, style)
    return {**links, "dp": links["dp_shard"]} if "dp_shard" in links else links


def link_text(link: GroupLink, hw: HardwareSpec, all_reduces: bool = False) -> str:
    """Where a group's traffic runs, saying what the bandwidth is per: a group inside a node gets
    its intra-node link per device; a group across nodes crosses each node through the NICs of its
    members there (:mod:`planc.hardware.topology`), an aggregate: "network 400 GB/s per node (8 NICs
    × 50 GB/s each)" -- unless that aggregate outruns the ring's hops inside the node, which then
    bound it per device (``GroupLink.capped``). ``all_reduces``: the row's traffic has all-reduces,
    which an NVSwitch that reduces (NVLS) prices at its own rate where it beats the ring."""
    medium, bandwidth = _medium(link.medium, hw), format_bandwidth(link.bandwidth)
    if link.crosses_nodes and link.per_node > 1:
        nic = hw.inter_node_bw * hw.inter_node_link_efficiency  # what a NIC moves, as link.bandwidth
        nics = f"{link.per_node} NICs × {format_bandwidth(nic)}"
        if link.capped:
            aggregate = format_bandwidth(link.per_node * nic)
            by = visible(hw.intra_node_link) if hw.intra_node_link_named else "the intra-node link"
            return (
                f"{medium} {bandwidth} per device (capped by {by}: the ring's hops inside "
                f"a node run at {bandwidth}, less than the node's {nics} = {aggregate})"
            )
        return f"{medium} {bandwidth} per node ({nics} each)"
    if all_reduces and switch_beats_ring(link):
        switch = format_bandwidth(link.switch_all_reduce_bw)
        return f"{medium} {bandwidth} per device; all-reduces in the NVSwitch (NVLS) at {switch} of buffer"
    return f"{medium} {bandwidth} per device"


def _row_link(group: str, links: dict[str, GroupLink]) -> GroupLink | None:
    """The link a communication row's traffic runs over: the pipeline's is its point-to-point
    hops' slowest (``pp_p2p``), not the pp group's ring."""
    return links.get(group if group != "pp" else "pp_p2p")


def bottleneck(est: Estimate, links: dict[str, GroupLink], hw: HardwareSpec) -> str:
    """What limits the step: memory (if it does not fit), else the largest part of the step."""
    if not est.fits:
        return "memory (the layout does not fit)"
    parts = est.step_parts()
    compute = parts.pop("compute") + parts.pop("recompute")
    step = est.step_s

    def named(key: str) -> str:
        share = parts[key] / step
        if key.endswith("exposed"):
            group = key.split()[0].lower()
            link = _row_link(group, links)
            where = f" over {link_text(link, hw)}" if link else ""
            return f"{group.upper()} communication{where} ({share:.0%} of the step)"
        if key == "bubble":
            return f"pipeline bubble ({share:.0%} of the step)"
        return f"{key} ({share:.0%} of the step)"

    runner_up = max(parts, key=lambda k: parts[k]) if parts else None
    if runner_up is None or compute >= parts[runner_up]:
        # Kernels shorter than their launch: the GPU waits on the host's Python, not on arithmetic.
        what = "compute, set by the host's eager dispatch, not the kernels" if est.host_bound else "compute"
        text = f"{what} ({compute / step:.0%} of the step)"
        if compute < 0.5 * step and runner_up is not None:  # no part is most of the step: name the next
            text += f", then {named(runner_up)}"
    else:
        text = named(runner_up)
    if est.memory_bytes > 0.95 * est.capacity:
        text += "; memory nearly full"
    return text


@dataclass(frozen=True)
class TakingPart:
    """A strategy the program for the chosen layout applies, as explain names it: installing a
    plugin whose ``enabled`` says yes changes the program, and a plan's reader must see that."""

    name: str
    builtin: bool
    distribution: str
    version: str
    named: bool
    """Whether the plan names it in a ``use`` block (a built-in takes part by the layout's rule)."""


def plugins_text(strategies: Sequence[TakingPart]) -> str:
    """``lowp_allreduce (planc-lowp-allreduce 0.1.0)``: the third-party strategies taking part,
    those the plan does not name marked; empty when only built-ins do, which the layout already
    implies. explain's ``plugins`` line, and ``planc run``'s and ``planc verify``'s, say this."""
    shown = [
        f"{s.name} ({s.distribution} {s.version}"
        + ("" if s.named else "; not named by the plan: the installed plugin joins on its own")
        + ")"
        for s in strategies
        if not s.builtin
    ]
    return " · ".join(visible(text) for text in shown)


def plugins_lines(strategies: Sequence[TakingPart]) -> list[str]:
    """``plugins   lowp_allreduce (planc-lowp-allreduce 0.1.0)``, or nothing (:func:`plugins_text`)."""
    text = plugins_text(strategies)
    return [f"  {'plugins':10}{text}"] if text else []


def to_dict(plan: Plan, choice: Choice, strategies: Sequence[TakingPart] = ()) -> dict[str, Any]:
    """The ``--json`` object; ``strategies``: those taking part in the chosen layout."""
    est, lay = choice.estimate, choice.layout
    links = shown_links(plan, lay, est.stage_style)
    return {
        "plan": plan.source,
        **_plan_dict(plan, est),
        "layout": layout_dict(lay),
        "strategies": [asdict(s) for s in strategies],
        "rung": rung_name(choice.layout),
        "fits": choice.fits,
        "fixed": choice.fixed,
        "suggestion": suggestion_text(choice.suggestion) if choice.suggestion else None,
        "memory": memory_dict(est),
        "time": {
            "step_s": est.step_s,
            "compute_s": est.compute - est.recompute,
            "recompute_s": est.recompute,
            "bubble_s": est.bubble,
            "optimizer_s": est.optimizer,
            "exposed_comm_s": {c.group: c.exposed for c in est.comm},
            "other_s": {t.name: t.value for t in est.other},
        },
        "comm": [_comm_dict(c, links, plan.hardware) for c in est.comm],
        "throughput": _throughput_dict(est),
        "training": totals_dict(plan, est) if est.fits else None,
        "uncertainty": _uncertainty_dict(plan, choice),
        "bottleneck": bottleneck(est, links, plan.hardware),
        "rejected": [rejection_dict(r) for r in choice.rejected],
        "alternatives": [_alternative_dict(a) for a in choice.alternatives],
        "search": {"scored": choice.scored, "seconds": choice.search_seconds, "tolerance": choice.tolerance},
        "margin": _margin_dict(choice),
        "advice": [{"kind": a.kind, "text": advice_text(a)} for a in choice.advice],
        "notes": list(est.notes) + list(plan.notes) + [advice_text(a) for a in choice.advice],
    }


def _throughput_dict(est: Estimate) -> dict[str, Any] | None:
    """None for a layout that does not fit: it runs nothing."""
    if not est.fits:
        return None
    return {
        "tokens_per_s": est.tokens_per_s,
        "model_tflops_per_device": est.model_tflops_per_device,
        "hardware_tflops_per_device": est.hardware_tflops_per_device,
        "mfu": est.mfu,
        "hfu": est.hfu,
    }


def _uncertainty_dict(plan: Plan, choice: Choice) -> dict[str, Any]:
    """The band, and where the chosen layout stands against the published checks
    (:mod:`planc.planner.checked`): ``checked`` is False past them."""
    regime = sharded_regime(choice.layout, choice.estimate)
    widest = widest_checked()
    return {
        "step_time_relative": step_time_uncertainty(plan.hardware),
        "basis": uncertainty_basis(plan.hardware),
        "checked": not unchecked(plan, choice.layout, choice.estimate),
        "sharded_dp": None
        if regime is None
        else {
            "shard_ranks": regime[0],
            "traffic_ratio": regime[1],
            "checked_up_to_ranks": widest.shard_ranks if widest else None,
        },
    }


def _margin_dict(choice: Choice) -> dict[str, Any] | None:
    m = choice.margin
    if m is None:
        return None
    return {
        "relative": m.relative,
        "floor_s": m.floor_s,
        "from_uncertainty": m.from_uncertainty,
        # where the band comes from: on an uncalibrated CPU not the plan's own (its uncertainty is null)
        "source": m.source,
        "stand_in": m.stand_in,
    }


def _plan_dict(plan: Plan, est: Estimate) -> dict[str, Any]:
    return {
        "model": {
            "name": plan.model.name,
            "params": plan.model.params,
            "layers": plan.model.layers,
            "hidden": plan.model.hidden,
            "flops_per_token": model_flops_per_token(plan.model),
        },
        "hardware": {
            "device": plan.hardware.device,
            "nodes": plan.hardware.nodes,
            "per_node": plan.hardware.per_node,
            "world_size": plan.world_size,
            "profile": plan.hardware.profile,
            "profile_measured_on": plan.hardware.measured.measured_on if plan.hardware.measured else None,
            # the line rates and the shares of them the tables price (the header's "links" line)
            "intra_node_bw": plan.hardware.intra_node_bw,
            "inter_node_bw": plan.hardware.inter_node_bw,
            "intra_node_link_efficiency": plan.hardware.intra_node_link_efficiency,
            "inter_node_link_efficiency": plan.hardware.inter_node_link_efficiency,
            "nvls_all_reduce_bw": plan.hardware.nvls_all_reduce_bw,
        },
        "batch": {
            "global_batch": plan.train.global_batch,
            "seq_len": plan.model.seq_len,
            "tokens_per_step": plan.tokens_per_step,
            "micro_batches": est.micro_batches,
        },
    }


def _comm_dict(c: CommCost, links: dict[str, GroupLink], hw: HardwareSpec) -> dict[str, Any]:
    link = _row_link(c.group, links)
    return {
        "group": c.group,
        "volume_bytes": c.volume,
        "total_s": c.total,
        "exposed_s": c.exposed,
        "medium": _medium(c.medium, hw),
        "detail": c.detail,
        "bandwidth": link.bandwidth if link else None,
        # A group across nodes crosses each node through its members' NICs: an aggregate per node,
        # unless the ring's hops inside the node bound it (per device; link_text says so).
        "bandwidth_per": (
            ("node" if link.crosses_nodes and link.per_node > 1 and not link.capped else "device") if link else None
        ),
    }


def _alternative_dict(a: Candidate) -> dict[str, Any]:
    return {
        "layout": layout_dict(a.layout),
        "describe": a.layout.describe(),
        "tokens_per_s": a.tokens_per_s,
        "step_s": a.estimate.step_s,
        "memory_bytes": a.estimate.memory_bytes,
        "rung": a.rung,
    }


def render_text(plan: Plan, choice: Choice, *, top_k: int | None = None, strategies: Sequence[TakingPart] = ()) -> str:
    """The human-readable explanation: the plan, the choice (with the plugins taking part),
    memory, time, why not simpler, the alternatives, the pipeline timeline and the notes."""
    est, lay = choice.estimate, choice.layout
    links = shown_links(plan, lay, est.stage_style)
    sections = [
        _header(plan, choice) + plugins_lines(strategies),
        memory_table(est, plan),
        _time_lines(est, links, plan),
        [
            *_throughput_lines(plan, est),
            f"  bottleneck {bottleneck(est, links, plan.hardware)}",
        ],
        ["  why not simpler", *_rejection_lines(choice)] if choice.rejected else [],
        _alternatives(choice, top_k),
        _timeline(choice),
        _notes(plan, est, choice),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections if lines) + "\n"


def _throughput_lines(plan: Plan, est: Estimate) -> list[str]:
    """Throughput, MFU with its band, and what the plan's whole run costs; a layout that does not
    fit runs nothing, so it gets none of these."""
    if not est.fits:
        return ["  throughput none: the layout does not fit, so it has no throughput, MFU or training time"]
    return [
        f"  throughput {format_count(est.tokens_per_s)} tokens/s · "
        f"{format_tflops(est.model_tflops_per_device)} model TFLOP/s per device · "
        f"{format_tflops(est.hardware_tflops_per_device)} hardware TFLOP/s · "
        f"{mfu_text(est.mfu, step_time_uncertainty(plan.hardware))}",
        totals_line(plan, est),
    ]


def _profile_line(hw) -> list[str]:
    """Which hardware profile priced the plan (``planc calibrate``), or that data-sheet numbers did."""
    if hw.profile is None or hw.measured is None:
        return []
    return [f"  profile   {visible(hw.profile)}: measured rates ({visible(hw.measured.measured_on)})"]


def _local_link(hw: HardwareSpec) -> str:
    """The header's name for the link between a node's devices."""
    return "between processes" if hw.is_cpu else visible(hw.intra_node_link)


def _link_share_line(hw: HardwareSpec) -> list[str]:
    """The links' rates the tables use: the line rates above less what the collective library's
    protocol costs (``hardware.*_link_efficiency``); nothing when they are taken whole."""
    local_link = _local_link(hw)
    shares = []
    if hw.per_node > 1 and hw.intra_node_link_efficiency < 1:
        moved = format_bandwidth(hw.intra_node_bw * hw.intra_node_link_efficiency)
        shares.append(f"{local_link} {hw.intra_node_link_efficiency:.0%} = {moved}")
    if hw.nodes > 1 and hw.inter_node_link_efficiency < 1:
        moved = format_bandwidth(hw.inter_node_bw * hw.inter_node_link_efficiency)
        shares.append(f"network {hw.inter_node_link_efficiency:.0%} = {moved}")
    if not shares:
        return []
    return ["  links     priced at what collectives move of those line rates: " + ", ".join(shares)]


def _header(plan: Plan, choice: Choice) -> list[str]:
    m, hw, tr = plan.model, plan.hardware, plan.train
    est, lay = choice.estimate, choice.layout
    nodes = f"{hw.nodes} node{'s' if hw.nodes != 1 else ''}"
    links = [f"{_local_link(hw)} {format_bandwidth(hw.intra_node_bw)} per device"] if hw.per_node > 1 else []
    if hw.nodes > 1:
        links.append(f"network {format_bandwidth(hw.inter_node_bw)} per device")
    lines = [
        visible(plan.source or "(plan)"),
        f"  model     {visible(m.name or 'custom')} · {format_count(m.params)} params · "
        f"{model_flops_per_token(m) / 1e12:.3g} TFLOP per token (fwd+bwd)",
        f"  hardware  {hw.world_size} × {visible(hw.device)} ({nodes} × {hw.per_node}) · "
        + "".join(f"{link} · " for link in links)
        + f"{format_bytes(hw.memory)} each",
        *_link_share_line(hw),
        *_profile_line(hw),
        f"  batch     {tr.global_batch} sequences × {m.seq_len} = {format_count(plan.tokens_per_step)} tokens "
        f"per step · {est.micro_batches} micro-batch(es) of {lay.micro_batch} per DP rank",
        "",
        f"  {_layout_label(choice):10}{lay.describe()} · {tr.precision} · {tr.optimizer}",
    ]
    if choice.fixed:
        lines.append("            fixed by the plan")
    elif not choice.fits:
        # No margin applies and no rung was chosen: say what the search found.
        pruned = "" if choice.scored else " · every (tp, pp, dp, zero)'s model states alone exceed the device"
        lines.append(
            f"            nothing fits: {choice.scored} layouts scored in {choice.search_seconds:.2f} s{pruned} · "
            "shown: the least memory-hungry"
        )
    else:
        lines.append(
            f"            rung: {rung_name(choice.layout)} · {choice.scored} layouts scored in "
            f"{choice.search_seconds:.2f} s · margin {choice.margin.describe() if choice.margin else choice.tolerance}"
        )
    if not choice.fits:
        lines += [
            "",
            f"  DOES NOT FIT: needs {format_bytes(est.memory_bytes)} per device, has {format_bytes(est.capacity)}",
        ]
        if choice.suggestion:
            lines.append(f"  what would fit: {suggestion_text(choice.suggestion)}")
    return lines


def _alternatives(choice: Choice, top_k: int | None) -> list[str]:
    alternatives = choice.alternatives[:top_k] if top_k is not None else choice.alternatives
    if not alternatives:
        return []
    lines = ["  alternatives (fastest that fit; step time against the chosen layout's)"]
    for i, a in enumerate(alternatives, 1):
        # One measure, the notes' (advice_words._within_margin: "would save 91.0 ms (1.6%) per
        # step"): the change of the step time, not of tokens/s (+1.6% of one is -1.6% of the other).
        change = format_signed_percent(a.estimate.step_s / choice.estimate.step_s - 1, 1).replace(".0%", "%")
        lines.append(f"    {i}. {a.layout.describe()}")
        lines.append(
            f"       {format_count(a.tokens_per_s)} tokens/s · step {format_seconds(a.estimate.step_s)} ({change}) · "
            f"{format_bytes(a.estimate.memory_bytes)}"
        )
    return lines


def _timeline(choice: Choice) -> list[str]:
    lay, est = choice.layout, choice.estimate
    if lay.pp == 1 or lay.schedule is None:
        return []
    return [
        f"  pipeline schedule ({lay.schedule}, {lay.pp} stages, v = {lay.virtual_stages})",
        ascii_timeline(lay.schedule, lay.pp, lay.virtual_stages, est.micro_batches, style=est.stage_style),
    ]


def _notes(plan: Plan, est: Estimate, choice: Choice) -> list[str]:
    notes = list(est.notes) + list(plan.notes) + [advice_text(a) for a in choice.advice]
    return ["  notes", *(f"    - {n}" for n in notes)] if notes else []


def _time_lines(est: Estimate, links: dict[str, GroupLink], plan: Plan) -> list[str]:
    hw = plan.hardware
    parts = est.step_parts()
    shown = " + ".join(f"{k} {format_seconds(v)}" for k, v in parts.items() if v > 0)
    band = step_time_uncertainty(plan.hardware)
    lines = [f"  step time {format_seconds(est.step_s)} {band_text(band)} = {shown}"]
    if band is None:
        lines.append(f"    uncalibrated: {uncertainty_basis(plan.hardware).removeprefix('none: ')}")
    if est.comm:
        lines.append(f"    {'communication':<16}{'per step':>12}{'total':>11}{'exposed':>11}   link")
        for c in est.comm:
            link = _row_link(c.group, links)
            where = link_text(link, hw, all_reduces="all-reduce" in c.detail) if link else _medium(c.medium, hw)
            lines.append(
                f"    {c.group.upper():<16}{format_bytes(c.volume):>12}{format_seconds(c.total):>11}"
                f"{format_seconds(c.exposed):>11}   {where}"
            )
            if c.detail:
                lines.append(f"    {'':<16}{c.detail}")
    return lines


def _rejection_lines(choice: Choice) -> list[str]:
    lines, i = [], 0
    rows = choice.rejected
    while i < len(rows):
        j = i
        while j + 1 < len(rows) and rejection_reason(rows[j + 1]) == rejection_reason(rows[i]):
            j += 1
        name = rows[i].strategy if i == j else f"{rows[i].strategy} … {rows[j].strategy}"
        if len(name) > 22:
            lines.append(f"    {name}")
            name = ""
        lines.append(f"    {name:<24}{rejection_reason(rows[i])}")
        i = j + 1
    return lines


def _layout_label(choice: Choice) -> str:
    """What the header's layout is: the plan's own, the planner's choice, or the closest to fitting."""
    return "layout" if choice.fixed else "chosen" if choice.fits else "closest"
