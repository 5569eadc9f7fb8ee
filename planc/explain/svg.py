"""``planc explain --svg``: the memory breakdown and the pipeline schedule as one SVG picture.

Hand-written SVG (no plotting dependency). Text is escaped; nothing from the plan is pasted
unescaped.
"""

from __future__ import annotations

from html import escape

from planc.cost.estimate import Estimate
from planc.explain.timeline import simulate
from planc.explain.visible import visible
from planc.planner.choose import Choice
from planc.spec.layout import Layout
from planc.spec.plan import Plan
from planc.units import format_bytes

WIDTH = 900
COLORS = {
    "parameters": "#4e79a7",
    "master weights": "#76b7b2",
    "gradients": "#f28e2b",
    "optimizer": "#e15759",
    "activations": "#59a14f",
    "buffers": "#b07aa1",
    "F": "#4e79a7",
    "B": "#f28e2b",
    "W": "#59a14f",
}


def render_svg(plan: Plan, choice: Choice) -> str:
    est, lay = choice.estimate, choice.layout
    s = est.memory
    parts = [
        ("parameters", s.params),
        ("master weights", s.master),
        ("gradients", s.grads_at_peak),
        ("optimizer", s.optimizer),
        ("activations", s.activations),
        ("buffers", s.transient_bytes),
    ]
    scale_bytes = max(s.total, est.capacity)
    bar_w = WIDTH - 80
    els: list[str] = []
    title = f"{plan.model.name or 'model'} on {plan.world_size} × {plan.hardware.device}: {lay.describe()}"
    worst = f" (worst: pipeline rank {s.rank})" if lay.pp > 1 else ""
    caption = f"memory per device{worst}: {format_bytes(s.total)} of " + (
        f"{format_bytes(est.capacity)}" + ("" if est.fits else " — DOES NOT FIT")
    )
    schedule_caption = _schedule_caption(lay, est) if lay.pp > 1 else ""
    # Wide enough for the longest line of text (bold: 5% wider); the bars keep their width.
    width = int(max(WIDTH, 20 + 1.05 * text_width(title, 14) + MARGIN, 20 + text_width(caption, 12) + MARGIN))
    width = int(max(width, 20 + text_width(schedule_caption, 12) + MARGIN))
    els.append(_text(20, 24, title, size=14, weight="bold"))
    els.append(_text(20, 48, caption))
    x, y = 40.0, 60
    for name, value in parts:
        if value <= 0:
            continue
        w = bar_w * value / scale_bytes
        els.append(
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="28" fill="{COLORS[name]}">'
            f"<title>{escape(visible(name))}: {format_bytes(value)}</title></rect>"
        )
        x += w
    cap_x = 40 + bar_w * est.capacity / scale_bytes
    els.append(
        f'<line x1="{cap_x:.1f}" y1="{y - 6}" x2="{cap_x:.1f}" y2="{y + 34}" stroke="black" '
        f'stroke-width="2" stroke-dasharray="4 2"/>'
    )
    els.append(_text(cap_x - 60, y + 48, "capacity", size=11))
    height = _legend(els, [(name, value) for name, value in parts if value > 0], top=y + 56)
    if lay.pp > 1:
        height = _schedule(els, lay, est, top=height + 10, caption=schedule_caption)
    body = "\n  ".join(els)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 10}" '
        f'font-family="sans-serif">\n  <rect width="100%" height="100%" fill="white"/>\n  {body}\n</svg>\n'
    )


def _legend(els: list[str], parts: list[tuple[str, float]], top: float) -> int:
    """One swatch and label per part, wrapped onto a new row before a label would cross the right
    edge (label widths from :func:`text_width`); returns the y below the legend."""
    lx, y = 40.0, top
    for name, value in parts:
        label = f"{name} {format_bytes(value)}"
        item = 16 + text_width(label, 11)
        if lx > 40 and lx + item > WIDTH - MARGIN:
            lx, y = 40.0, y + 18
        els.append(f'<rect x="{lx:.1f}" y="{y}" width="12" height="12" fill="{COLORS[name]}"/>')
        els.append(_text(lx + 16, y + 10, label, size=11))
        lx += item + 14
    return int(y + 34)


#: Space kept free at the right edge.
MARGIN = 10
#: Advance widths of sans-serif glyphs in ems, rounded up from Helvetica/Arial's (lowercase and
#: digits <= 0.56, most capitals <= 0.72, M W m w up to 0.94): an upper bound, so text never
#: runs past the width it is given.
_WIDE, _CAPITAL, _NARROW = 0.95, 0.75, 0.6


def text_width(text: str, size: float) -> float:
    """An upper bound of the width of ``text`` in pixels at font size ``size``."""
    return size * sum(_WIDE if c in "MWmw@%" or ord(c) > 127 else _CAPITAL if c.isupper() else _NARROW for c in text)


def _schedule_caption(lay: Layout, est: Estimate) -> str:
    schedule, p, v, m = lay.schedule or "1f1b", lay.pp, lay.virtual_stages, est.micro_batches
    return (
        f"pipeline schedule: {schedule}, {p} stages, v = {v}, first {min(m, 2 * p)} of {m} "
        f"micro-batches (F blue, B orange, W green, gaps = bubble)"
    )


def _schedule(els: list[str], lay: Layout, est: Estimate, top: int, caption: str) -> int:
    """The replayed pipeline schedule of the chosen layout (:mod:`planc.explain.timeline`)."""
    schedule, p, v, m = lay.schedule or "1f1b", lay.pp, lay.virtual_stages, est.micro_batches
    shown_m = min(m, 2 * p)
    ops = simulate(schedule, p, v, shown_m, est.stage_style)
    end = max(o.end for o in ops)
    ranks = list(range(p)) if p <= 16 else list(range(8)) + list(range(p - 8, p))
    row_h = max(6, min(18, 320 // len(ranks)))
    els.append(_text(20, top + 14, caption))
    y0 = top + 24
    unit = (WIDTH - 80) / end
    for i, r in enumerate(ranks):
        y = y0 + i * row_h
        els.append(_text(4, y + row_h - 2, f"{r}", size=9))
        for o in ops:
            if o.rank != r:
                continue
            els.append(
                f'<rect x="{40 + o.start * unit:.2f}" y="{y}" width="{max(0.5, (o.end - o.start) * unit - 0.5):.2f}" '
                f'height="{row_h - 1}" fill="{COLORS[o.kind]}"><title>{o.kind} chunk {o.chunk} '
                f"micro-batch {o.micro_batch}</title></rect>"
            )
    return y0 + len(ranks) * row_h


def _text(x: float, y: float, text: str, size: int = 12, weight: str = "normal") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" font-weight="{weight}">{escape(visible(text))}</text>'
