"""The memory of the worst pipeline rank as ``planc explain`` shows it: the text table and the
``--json`` ``memory`` object, both built from the same rows so that they cannot disagree.

A :class:`~planc.cost.estimate.StageMemory` holds some terms only during one phase of the step
(docs/cost-model.md, "The peak is the largest phase of the step"): the table adds the rows held
at the stage's peak and lists the others apart as "not at the peak"; the JSON carries every row
with its phases and an ``at_peak`` flag, so the at-peak rows of each group sum to its total.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from planc.cost.estimate import PHASES_JOINED, Estimate, StageMemory, Term
from planc.spec.plan import Plan
from planc.units import format_bytes

GiB = 2**30


class MemoryRow(NamedTuple):
    """One line of the memory table."""

    name: str
    value: float
    """Bytes."""
    phases: tuple[str, ...] = ()
    """The phases of the step that hold these bytes (none: held throughout)."""
    at_peak: bool = True
    """Whether the stage's peak holds them: only these add up to the group's total."""

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.value, "phases": list(self.phases), "at_peak": self.at_peak}


def _term_rows(s: StageMemory, terms: tuple[Term, ...]) -> list[MemoryRow]:
    return [MemoryRow(t.name, t.value, t.phases, s.at_peak(t)) for t in terms]


def activation_rows(s: StageMemory) -> list[MemoryRow]:
    """The blocks' saved activations at the peak, then the other activation terms."""
    held = s.block_activations / s.act_per_layer if s.act_per_layer else s.act_layers
    blocks = MemoryRow(f"blocks ({held:g} block-micro-batches in flight)", s.block_activations)
    return [blocks, *_term_rows(s, s.act_extra)]


def transient_rows(s: StageMemory) -> list[MemoryRow]:
    """Buffers and overheads: gathers, buckets, receive buffers, runtime, allocator margin."""
    return _term_rows(s, s.transient)


#: The gradients row of a stage whose wrapper keeps an accumulation in place of the sharded
#: gradients (``StageMemory.accumulated_grads``: FSDP under a pipeline).
ACCUMULATED_GRADIENTS = "gradients: unsharded fp32, accumulated over micro-batches (sharded at the step's end)"


def gradients_name(s: StageMemory) -> str:
    """The gradients row's name: what the stage holds of them after a backward."""
    return "gradients" if s.accumulated_grads is None else ACCUMULATED_GRADIENTS


def memory_rows(est: Estimate) -> list[tuple[str, float, list[tuple[str, float]]]]:
    """The memory of the worst pipeline rank as (group, bytes, [(row, bytes)]) held at its peak:
    every group's bytes are the sum of its rows, and the groups' sum is the total."""
    s = est.memory
    return [
        (
            "model states",
            s.model_states_at_peak,
            [
                ("parameters (working copy)", s.params),
                ("master weights (fp32)", s.master),
                (gradients_name(s), s.grads_at_peak),
                ("optimizer states", s.optimizer),
            ],
        ),
        ("activations", s.activations, [(r.name, r.value) for r in activation_rows(s) if r.at_peak]),
        ("buffers and overheads", s.transient_bytes, [(r.name, r.value) for r in transient_rows(s) if r.at_peak]),
    ]


def memory_dict(est: Estimate) -> dict[str, Any]:
    """The ``--json`` ``memory`` object: the table's totals, and every row of its activation and
    buffer groups (``activation_terms``, ``transient_terms``) with its phases and whether it is
    held at the peak; the rows with ``at_peak`` sum to ``activations_bytes`` and
    ``transient_bytes``."""
    worst = est.memory
    return {
        "stage": worst.rank,
        "params_bytes": worst.params,
        "master_bytes": worst.master,
        "grads_bytes": worst.grads_at_peak,  # at the peak: none yet when it comes before the first backward
        "grads_after_backward_bytes": worst.grads_after_backward,
        "optimizer_bytes": worst.optimizer,  # Adam m and v (or momentum) only: master_bytes is its own part
        "activations_bytes": worst.activations,
        "transient_bytes": worst.transient_bytes,
        "total_bytes": worst.total,
        "capacity_bytes": est.capacity,
        "peak_phase": worst.peak_phase,
        "activation_terms": [r.as_dict() for r in activation_rows(worst)],
        "transient_terms": [r.as_dict() for r in transient_rows(worst)],
    }


def table_unit(s: StageMemory) -> tuple[str, int]:
    """The table's unit: MiB for a small model (a CPU run), where every row would read 0.00 GiB."""
    return ("GiB", GiB) if s.total >= GiB else ("MiB", 2**20)


def memory_table(est: Estimate, plan: Plan) -> list[str]:
    """The text table: the rows at the peak by group, the total against the capacity, then the
    rows held in another phase of the step (shown, not added). The printed rows add up to their
    printed group and the groups to the printed total (:func:`printed_hundredths`); ``--json``
    keeps the exact bytes."""
    groups = memory_rows(est)
    hw = plan.hardware
    names = [name for _, _, rows in groups for name, _ in rows]
    width = max(44, *(len(n) + 4 for n in names))
    s = est.memory
    unit, size = table_unit(s)
    pipelined = len(est.stages) > 1  # one stage without PP: "worst" would say nothing
    title = "  memory per device" + (f" (worst: pipeline rank {s.rank})" if pipelined else "")
    lines = [title + unit.rjust(4 + width + 8 - len(title))]
    total = round(s.total / size * 100)
    for (group, _, rows), shown in zip(groups, printed_hundredths([g / size for _, g, _ in groups], total)):
        rows = [(name, value) for name, value in rows if value]
        lines.append(f"    {group:<{width}}{shown / 100:>8.2f}")
        parts = printed_hundredths([value / size for _, value in rows], shown)
        lines += [f"      {name:<{width - 2}}{part / 100:>8.2f}" for (name, _), part in zip(rows, parts)]
    share = s.total / est.capacity
    headroom = f" = {format_bytes(hw.memory)} less {hw.headroom:.0%} headroom" if hw.headroom else ""
    lines.append(f"    {'total':<{width}}{total / 100:>8.2f}  of {format_bytes(est.capacity)}  ({share:.0%}){headroom}")
    elsewhere = [
        (f"{r.name} ({PHASES_JOINED.join(r.phases)} phase{'s' if len(r.phases) > 1 else ''})", r.value)
        if r.phases
        else (r.name, r.value)  # held outside the peak's moment, which its name says (Term.held)
        for r in (*activation_rows(s), *transient_rows(s))
        if not r.at_peak
    ]
    if s.grads_at_peak < s.grads_after_backward:
        name = gradients_name(s) + ", from the step's first backward on (set to None between steps)"
        if s.stages_without_grads:  # an interleaved rank's earlier stages run no backward by the peak
            n = s.stages_without_grads
            name = (
                gradients_name(s) + ", each stage's from its first backward on (set to None between steps; "
                f"{n} of the rank's stages begin theirs after the peak)"
            )
        elsewhere.append((name, s.grads_after_backward))
    if elsewhere:  # held in another phase of the step than the peak: shown, not added
        where = f"the {s.peak_phase} phase" if s.peak_phase else "the forward's end"
        lines += ["", f"    not at the peak ({where} is larger):"]
        lines += [f"      {name:<{width - 2}}{value / size:>8.2f}" for name, value in elsewhere]
    return lines


def printed_hundredths(values: list[float], total: int) -> list[int]:
    """``values`` (which add up to about ``total / 100``) in whole hundredths that add up to
    exactly ``total``: each rounded down, then the hundredths left over go to the values with the
    largest remainders (largest-remainder apportionment, Hamilton's method), equal values together
    where enough are left (fp32 master weights and gradients are the same size and should read so),
    else to the next largest remainder. Rounding each row on its own printed rows that missed their
    printed total by 0.01 (issue 12: every printed total is the sum of its printed rows); this
    moves no value by more than 0.01 from its exact figure."""
    if not values:
        return []
    scaled = [v * 100 for v in values]
    shown = [math.floor(x) for x in scaled]
    left = total - sum(shown)
    if left < 0:  # only when the values add up to more than the total: take from the smallest remainders
        for i in sorted(range(len(values)), key=lambda i: scaled[i] - shown[i])[:-left]:
            shown[i] -= 1
        return shown
    equal: dict[float, list[int]] = {}
    for i, x in enumerate(scaled):
        equal.setdefault(x, []).append(i)
    blocs = sorted(equal.values(), key=lambda bloc: scaled[bloc[0]] - shown[bloc[0]], reverse=True)
    for bloc in blocs:
        if 0 < len(bloc) <= left:
            left -= len(bloc)
            for i in bloc:
                shown[i] += 1
    # Still left: equal values that did not fit together; split the largest remainder's.
    order = sorted(range(len(values)), key=lambda i: scaled[i] - shown[i], reverse=True)
    for k in range(left):
        shown[order[k % len(order)]] += 1
    return shown
