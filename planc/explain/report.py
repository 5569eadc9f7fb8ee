"""``planc explain``: the planner's choice in words and numbers (text and JSON).

Every number printed comes from the :class:`~planc.cost.Estimate` of the chosen layout; the
formulas behind each are in docs/cost-model.md.
"""

from __future__ import annotations

from planc.cost.context import ContextCache
from planc.cost.estimate import Estimate
from planc.cost.flops import model_flops_per_token
from planc.explain.timeline import ascii_timeline
from planc.explain.visible import visible
from planc.planner.choose import Choice, step_parts
from planc.spec.plan import Plan
from planc.units import format_bytes

GiB = 2**30


def _num(n: float) -> str:
    """1 234 567 -> '1.23 M'; beyond a thousand T, plain scientific notation."""
    if abs(n) >= 1e15:
        return f"{n:.3g}"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.3g}"


def _rate(tflops: float) -> str:
    """TFLOP/s: whole numbers for GPUs, three digits for a CPU's fraction of one (not "0")."""
    return f"{tflops:.0f}" if tflops >= 10 else f"{tflops:.3g}"


def _sec(s: float) -> str:
    if s >= 100:
        return f"{s:.0f} s"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def _bw(bytes_per_s: float) -> str:
    return "∞" if bytes_per_s == float("inf") else f"{bytes_per_s / 1e9:.4g} GB/s"


def _medium(name: str, cpu: bool) -> str:
    """How to call a link: CPU processes of one machine talk over gloo, not NVLink."""
    return "intra-node" if cpu and name == "nvlink" else name


def bottleneck(est: Estimate, links: dict, *, cpu: bool = False) -> str:
    """What limits the step: memory (if it does not fit), else the largest part of the step."""
    if not est.fits:
        return "memory (the layout does not fit)"
    parts = step_parts(est)
    compute = parts.pop("compute") + parts.pop("recompute")
    step = est.step_s
    if not parts or compute >= 0.5 * step:
        text = f"compute ({compute / step:.0%} of the step)"
    else:
        key = max(parts, key=parts.get)
        share = parts[key] / step
        if key.endswith("exposed"):
            group = key.split()[0].lower()
            link = links.get(group if group != "pp" else "pp_p2p")
            where = f" over {_medium(link.medium, cpu)} at {_bw(link.bandwidth)} per device" if link else ""
            text = f"{group.upper()} communication{where} ({share:.0%} of the step)"
        elif key == "bubble":
            text = f"pipeline bubble ({share:.0%} of the step)"
        else:
            text = f"{key} ({share:.0%} of the step)"
    if est.memory_bytes > 0.95 * est.capacity:
        text += "; memory nearly full"
    return text


def to_dict(plan: Plan, choice: Choice) -> dict:
    """The ``--json`` object."""
    est, lay = choice.estimate, choice.layout
    worst = est.memory
    links = ContextCache(plan).links(lay)
    time = {
        "step_s": est.step_s,
        "compute_s": est.compute - est.recompute,
        "recompute_s": est.recompute,
        "bubble_s": est.bubble,
        "optimizer_s": est.optimizer,
        "exposed_comm_s": {c.group: c.exposed for c in est.comm},
        "other_s": {t.name: t.value for t in est.other},
    }
    return {
        "plan": plan.source,
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
        },
        "batch": {
            "global_batch": plan.train.global_batch,
            "seq_len": plan.model.seq_len,
            "tokens_per_step": plan.tokens_per_step,
            "micro_batches": est.micro_batches,
        },
        "layout": {
            k: getattr(lay, k)
            for k in (
                "tp",
                "pp",
                "dp",
                "zero",
                "recompute",
                "schedule",
                "micro_batch",
                "virtual_stages",
                "sequence_parallel",
            )
        },
        "rung": choice.rung,
        "fits": choice.fits,
        "fixed": choice.fixed,
        "suggestion": choice.suggestion,
        "memory": {
            "stage": worst.rank,
            "params_bytes": worst.params,
            "master_bytes": worst.master,
            "grads_bytes": worst.grads,
            "optimizer_bytes": worst.optimizer + worst.master,
            "activations_bytes": worst.activations,
            "transient_bytes": worst.transient_bytes,
            "total_bytes": worst.total,
            "capacity_bytes": est.capacity,
            "activation_terms": {t.name: t.value for t in worst.act_extra},
            "transient_terms": {t.name: t.value for t in worst.transient},
        },
        "time": time,
        "comm": [
            {
                "group": c.group,
                "volume_bytes": c.volume,
                "total_s": c.total,
                "exposed_s": c.exposed,
                "medium": c.medium,
                "detail": c.detail,
                "bandwidth": links[c.group].bandwidth if c.group in links else None,
            }
            for c in est.comm
        ],
        "throughput": {
            "tokens_per_s": est.tokens_per_s,
            "model_tflops_per_device": est.model_tflops_per_device,
            "hardware_tflops_per_device": est.hardware_tflops_per_device,
            "mfu": est.mfu,
            "hfu": est.hfu,
        },
        "bottleneck": bottleneck(est, links, cpu=plan.hardware.is_cpu),
        "rejected": [r.to_dict() for r in choice.rejected],
        "alternatives": [
            {
                "layout": {
                    k: getattr(a.layout, k)
                    for k in (
                        "tp",
                        "pp",
                        "dp",
                        "zero",
                        "recompute",
                        "schedule",
                        "micro_batch",
                        "virtual_stages",
                        "sequence_parallel",
                    )
                },
                "describe": a.layout.describe(),
                "tokens_per_s": a.tokens_per_s,
                "step_s": a.estimate.step_s,
                "memory_bytes": a.estimate.memory_bytes,
                "rung": a.rung,
            }
            for a in choice.alternatives
        ],
        "search": {"scored": choice.scored, "seconds": choice.search_seconds, "tolerance": choice.tolerance},
        "notes": list(est.notes) + list(plan.notes),
    }


def render_text(plan: Plan, choice: Choice, *, top_k: int | None = None) -> str:
    """The human-readable explanation."""
    m, hw, tr = plan.model, plan.hardware, plan.train
    est, lay = choice.estimate, choice.layout
    links = ContextCache(plan).links(lay)
    out: list[str] = []
    add = out.append
    add(visible(plan.source or "(plan)"))
    add(
        f"  model     {visible(m.name or 'custom')} · {_num(m.params)} params · "
        f"{model_flops_per_token(m) / 1e12:.3g} TFLOP per token (fwd+bwd)"
    )
    nodes = f"{hw.nodes} node{'s' if hw.nodes != 1 else ''}"
    local_link = "between processes" if hw.is_cpu else "NVLink"
    add(
        f"  hardware  {hw.world_size} × {visible(hw.device)} ({nodes} × {hw.per_node}) · "
        f"{local_link} {_bw(hw.intra_node_bw)} · network {_bw(hw.inter_node_bw)} per device · "
        f"{format_bytes(hw.memory)} each"
    )
    add(
        f"  batch     {tr.global_batch} sequences × {m.seq_len} = {_num(plan.tokens_per_step)} tokens per step · "
        f"{est.micro_batches} micro-batch(es) of {lay.micro_batch} per DP rank"
    )
    add("")
    verdict = "fixed by the plan" if choice.fixed else f"rung: {choice.rung}"
    add(f"  {'layout' if choice.fixed else 'chosen'}    {lay.describe()} · {tr.precision} · {tr.optimizer}")
    search = (
        ""
        if choice.fixed
        else (f" · {choice.scored} layouts scored in {choice.search_seconds:.2f} s · tolerance {choice.tolerance:.0%}")
    )
    add(f"            {verdict}{search}")
    if not choice.fits:
        add("")
        add(f"  DOES NOT FIT: needs {format_bytes(est.memory_bytes)} per device, has {format_bytes(est.capacity)}")
        if choice.suggestion:
            add(f"  what would fit: {choice.suggestion}")
    add("")
    out += _memory_table(est)
    add("")
    out += _time_lines(est, links, cpu=hw.is_cpu)
    add("")
    add(
        f"  throughput {_num(est.tokens_per_s)} tokens/s · {_rate(est.model_tflops_per_device)} model TFLOP/s per "
        f"device · {_rate(est.hardware_tflops_per_device)} hardware TFLOP/s · MFU {est.mfu:.0%}"
    )
    add(f"  bottleneck {bottleneck(est, links, cpu=hw.is_cpu)}")
    if choice.rejected:
        add("")
        add("  why not simpler")
        out += _rejection_lines(choice)
    alternatives = choice.alternatives[:top_k] if top_k is not None else choice.alternatives
    if alternatives:
        add("")
        add("  alternatives (fastest that fit)")
        for i, a in enumerate(alternatives, 1):
            rel = a.tokens_per_s / est.tokens_per_s - 1
            add(f"    {i}. {a.layout.describe()}")
            add(
                f"       {_num(a.tokens_per_s)} tokens/s ({rel:+.0%}) · step {_sec(a.estimate.step_s)} · "
                f"{format_bytes(a.estimate.memory_bytes)}"
            )
    if lay.pp > 1:
        add("")
        add(f"  pipeline schedule ({lay.schedule}, {lay.pp} stages, v = {lay.virtual_stages})")
        add(ascii_timeline(lay.schedule, lay.pp, lay.virtual_stages, est.micro_batches))
    notes = list(est.notes) + list(plan.notes)
    if notes:
        add("")
        add("  notes")
        out += [f"    - {n}" for n in notes]
    return "\n".join(out) + "\n"


def _memory_table(est: Estimate) -> list[str]:
    s = est.memory
    rows = [
        ("parameters (working copy)", s.params),
        ("master weights (fp32)", s.master),
        ("gradients", s.grads),
        ("optimizer states", s.optimizer),
        (f"activations ({s.act_layers:g} block-micro-batches in flight)", s.act_per_layer * s.act_layers),
    ]
    rows += [(f"  {t.name}", t.value) for t in s.act_extra]
    rows.append(("buffers and overheads", s.transient_bytes))
    rows += [(f"  {t.name}", t.value) for t in s.transient]
    lines = [f"  memory per device (worst: pipeline rank {s.rank}){'GiB':>19}"]
    for name, value in rows:
        if value or not name.startswith("  "):
            lines.append(f"    {name:<56}{value / GiB:>8.2f}")
    share = s.total / est.capacity
    lines.append(f"    {'total':<56}{s.total / GiB:>8.2f}  of {est.capacity / GiB:.1f}  ({share:.0%})")
    return lines


def _time_lines(est: Estimate, links: dict, *, cpu: bool) -> list[str]:
    parts = step_parts(est)
    shown = " + ".join(f"{k} {_sec(v)}" for k, v in parts.items() if v > 0)
    lines = [f"  step time {_sec(est.step_s)} = {shown}"]
    if est.comm:
        lines.append(f"    {'communication':<16}{'per step':>12}{'total':>11}{'exposed':>11}   link")
        for c in est.comm:
            link = links.get(c.group if c.group != "pp" else "pp_p2p")
            where = f"{_medium(c.medium, cpu)} {_bw(link.bandwidth)}" if link else _medium(c.medium, cpu)
            lines.append(
                f"    {c.group.upper():<16}{format_bytes(c.volume):>12}{_sec(c.total):>11}"
                f"{_sec(c.exposed):>11}   {where}"
            )
            if c.detail:
                lines.append(f"    {'':<16}{c.detail}")
    return lines


def _rejection_lines(choice: Choice) -> list[str]:
    lines, i = [], 0
    rows = choice.rejected
    while i < len(rows):
        j = i
        while j + 1 < len(rows) and rows[j + 1].reason == rows[i].reason:
            j += 1
        name = rows[i].strategy if i == j else f"{rows[i].strategy} … {rows[j].strategy}"
        if len(name) > 22:
            lines.append(f"    {name}")
            name = ""
        lines.append(f"    {name:<24}{rows[i].reason}")
        i = j + 1
    return lines
