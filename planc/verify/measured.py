"""The "measured" column ``planc explain`` shows when ``planc verify`` has run the same plan.

Pure (no torch): reads the result :mod:`planc.verify.results` kept for the plan's key and lists,
for every quantity verify compared, the rank that differed most from the prediction. Under a
CPU stand-in the model, batch or device differ from the plan's, so only the errors carry over
(the column says so).
"""

from __future__ import annotations

from planc.verify.report import Row, value_text


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


def measured_lines(result: dict) -> list[str]:
    """The explain section: predicted, measured and error per quantity."""
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
    return lines


def measured_dict(result: dict) -> dict:
    """explain --json's ``measured``: the same rows as data."""
    return {
        "key": result.get("key"),
        "stand_in": result.get("stand_in", []),
        "rows": [row.as_dict() for row in worst_rows(result)],
    }
