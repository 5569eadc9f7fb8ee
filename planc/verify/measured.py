"""The "measured" column ``planc explain`` shows when ``planc verify`` has run the same plan.

Pure (no torch): reads the result :mod:`planc.verify.results` kept for the plan's key and lists,
for every quantity verify compared, the rank that differed most from the prediction. Under a
CPU stand-in the model, batch or device differ from the plan's, so only the errors carry over
(the column says so).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planc.verify.predicted import PEAK_NET_WORDS, peak_net_bytes
from planc.verify.report import Row, value_text
from planc.verify.results import predicted_by_another_model

if TYPE_CHECKING:
    from planc.cost.estimate import StageMemory


def worst_rows(result: dict) -> list[Row]:
    """Per (section, quantity): the row with the largest |error| over the ranks (first seen if none has one)."""
    chosen: dict[tuple[str, str], Row] = {}
    for data in result.get("rows", []):
        row = Row(**{k: v for k, v in data.items() if k != "error"})
        key = (row.section, row.name)
        best = chosen.get(key)
        if best is None or (row.error is not None and (best.error is None or abs(row.error) > abs(best.error))):
            chosen[key] = row
    return list(chosen.values())


def measured_lines(result: dict, memory: StageMemory | None = None, pipelined: bool = False) -> list[str]:
    """The explain section: predicted, measured and error per quantity; under a peak row, how its
    prediction relates to the total of the memory table above (``memory``, the table's stage, named
    by its pipeline rank only when ``pipelined``, as the table's title names it)."""
    stand_in = bool(result.get("stand_in"))
    if result.get("simulated"):
        title = (
            f"  simulated by planc verify --simulate (fake tensors at {result.get('world_size')} ranks; "
            "peak net of CUDA context and allocator margin)"
        )
    else:
        title = f"  measured by planc verify ({result.get('world_size')} process(es) on {result.get('device')}"
        title += ", a CPU stand-in: compare the errors, not the sizes)" if stand_in else ")"
    lines = [title, f"    {'':<46}{'predicted':>12}{'measured':>12}{'error':>9}  rank"]
    for row in worst_rows(result):
        if row.measured is None:
            continue
        error = f"{row.error:+.1%}" if row.error is not None else "-"
        name = f"{row.section}: {row.name}"
        predicted, measured = value_text(row.predicted, row.unit), value_text(row.measured, row.unit)
        lines.append(f"    {name:<46}{predicted:>12}{measured:>12}{error:>9}  {row.rank}")
    if memory is not None and any(r.section == "peak memory" and r.measured is not None for r in worst_rows(result)):
        relation = _net_relation(memory, pipelined, stand_in)
        lines += [f"    peak memory: predicted {PEAK_NET_WORDS}:", f"      {relation}"]
    return lines


def _net_relation(memory: StageMemory, pipelined: bool, stand_in: bool) -> str:
    """``the total 32.99 MiB above, less 1.57 MiB = 31.42 MiB`` (``pipeline rank 0's total ...`` under a
    pipeline), in the table's unit. Under a CPU stand-in the peak rows' prediction is the stand-in's,
    not the table's: the relation is the plan's, and the line says the row is not it."""
    from planc.explain.memory_table import table_unit

    unit, size = table_unit(memory)
    net = peak_net_bytes(memory)
    whose = f"pipeline rank {memory.rank}'s total" if pipelined else "the total"
    relation = (
        f"{whose} {memory.total / size:.2f} {unit} above, "
        f"less {(memory.total - net) / size:.2f} {unit} = {net / size:.2f} {unit}"
    )
    if stand_in:
        return f"for the plan, {relation}; the rows' prediction is the stand-in's, net the same way"
    return relation


def measured_dict(result: dict, memory: StageMemory | None = None, fingerprint: str | None = None) -> dict:
    """explain --json's ``measured``: the same rows as data, and what the peak rows' prediction is:
    ``peak_predicted`` in words and, for the memory table's stage, ``peak_net_bytes`` beside its
    ``memory.total_bytes``. ``fingerprint``: this planc's cost model for the plan, its plugins'
    cost passes included (:func:`planc.verify.results.cost_model_fingerprint`)."""
    body = {
        "key": result.get("key"),
        "stand_in": result.get("stand_in", []),
        "rows": [row.as_dict() for row in worst_rows(result)],
        "peak_predicted": PEAK_NET_WORDS,
        "predicted_by_another_model": predicted_by_another_model(result, fingerprint),
    }
    if memory is not None:
        body["peak_net_bytes"] = peak_net_bytes(memory)
    return body
