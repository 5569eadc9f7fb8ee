"""Syntax tree -> the plain ``raw`` dict :func:`planc.spec.build_plan` validates, and back again
for errors: every :class:`~planc.spec.SpecIssue` (addressed by key path) becomes a located
:class:`~planc.errors.PlanError` (addressed by file, line and column).

``lower`` keeps two maps from key path to source position: where each *value* is (and each
block header, for issues about a whole block) and where each *key* is (for "unknown key").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planc.dsl import ast
from planc.dsl.parser import in_source_order
from planc.errors import PlanError, PlanErrors, SourceLocation, did_you_mean, one_of
from planc.spec import BLOCKS, Plan, SpecError, SpecIssue, build_plan
from planc.units import UNITS, Quantity

KeyPath = tuple  # of str | int, as in planc.spec.issues


@dataclass
class Lowered:
    """The ``raw`` plan data plus where in the source each part of it came from."""

    plan_file: ast.PlanFile
    raw: dict[str, Any] = field(default_factory=dict)
    values: dict[KeyPath, SourceLocation] = field(default_factory=dict)
    keys: dict[KeyPath, SourceLocation] = field(default_factory=dict)
    errors: list[PlanError] = field(default_factory=list)
    #: Required blocks an unknown block name was probably meant to be ("hardwre" -> "hardware").
    meant_blocks: set[str] = field(default_factory=set)

    def where(self, node: ast.Node) -> SourceLocation:
        end = node.end_column if node.end_line == node.line else None
        return SourceLocation(self.plan_file.filename, node.line, node.column, end)

    def error(self, node: ast.Node, message: str, hint: str | None) -> None:
        self.errors.append(PlanError(message, location=self.where(node), hint=hint, source=self.plan_file.source))


def value_of(node: ast.Value) -> Any:
    """The plain Python value ``build_plan`` expects for a value node."""
    if isinstance(node, ast.ListValue):
        return [value_of(item) for item in node.items]
    if isinstance(node, ast.Quantity):
        kind, scale = UNITS[node.unit]
        return Quantity(value=node.number * scale, kind=kind, text=node.raw)
    if isinstance(node, ast.Auto):
        return "auto"
    return node.value


def lower(plan_file: ast.PlanFile) -> Lowered:
    out = Lowered(plan_file)
    for block in plan_file.blocks:
        if isinstance(block, ast.ModelBlock):
            _lower_model(out, block)
        elif isinstance(block, ast.UseBlock):
            _lower_use(out, block)
        elif block.name in BLOCKS:
            out.values[(block.name,)] = out.where(block.block_name)
            out.raw[block.name] = _entries(out, (block.name,), block.entries)
        else:
            suggestion = did_you_mean(block.name, [*BLOCKS, "use"])
            if suggestion:
                out.meant_blocks.add(suggestion.split("'")[1])
            out.error(block.block_name, f"unknown block '{block.name}'", suggestion or one_of([*BLOCKS, "use"]))
    return out


def _lower_model(out: Lowered, block: ast.ModelBlock) -> None:
    out.values[("model",)] = out.where(block.keyword)
    values: dict[str, Any] = {}
    written: dict[str, ast.Node] = {}
    if block.label is not None:
        values["name"] = block.label.value
        written["name"] = block.label
        out.values[("model", "name")] = out.keys[("model", "name")] = out.where(block.label)
    if block.source is not None:
        values["from"] = block.source.value
        written["from"] = block.source
        out.values[("model", "from")] = out.keys[("model", "from")] = out.where(block.source)
    for entry in block.entries:
        key = entry.key.text
        if key in written:
            first = written[key]
            header = block.label if key == "name" else block.source
            assert header is not None  # ``written`` holds only what the header set
            how = f'model "{header.value}"' if key == "name" else f'model from "{header.value}"'
            out.error(
                entry.key,
                f"'{key}' is set twice: by the block header and by this key",
                f"line {first.line} already says {how}; keep one of the two",
            )
            continue
        values[key] = value_of(entry.value)
        out.values[("model", key)] = out.where(entry.value)
        out.keys[("model", key)] = out.where(entry.key)
    out.raw["model"] = values


def _lower_use(out: Lowered, block: ast.UseBlock) -> None:
    index = len(out.raw.setdefault("uses", []))
    out.values[("uses", index)] = out.values[("uses", index, "name")] = out.where(block.strategy)
    options = _entries(out, ("uses", index, "options"), block.entries)
    out.raw["uses"].append({"name": block.strategy.text, "options": options})


def _entries(out: Lowered, prefix: KeyPath, entries: tuple[ast.Entry, ...]) -> dict[str, Any]:
    values = {}
    for entry in entries:
        values[entry.key.text] = value_of(entry.value)
        out.values[prefix + (entry.key.text,)] = out.where(entry.value)
        out.keys[prefix + (entry.key.text,)] = out.where(entry.key)
    return values


# -- from key paths back to the source --------------------------------------------------------

_ABOUT_THE_KEY = ("unknown key", "' is derived by planc", "unknown option")
_MISSING_BLOCK = re.compile(r"the plan has no (\w+) block")
#: Keys a plan may write in another form, which validation replaces: an issue about the key
#: points at the form the plan wrote (inter_node_bw_per_node becomes inter_node_bw).
_WRITTEN_AS = {("hardware", "inter_node_bw"): ("hardware", "inter_node_bw_per_node")}


def locate(issue: SpecIssue, lowered: Lowered) -> PlanError:
    """The PlanError for ``issue``, at the longest prefix of its path that the source has."""
    table = lowered.keys if any(marker in issue.message for marker in _ABOUT_THE_KEY) else lowered.values
    location = None
    for length in range(len(issue.path), 0, -1):
        prefix = tuple(issue.path[:length])
        location = table.get(prefix) or lowered.values.get(prefix)
        if location is None and prefix in _WRITTEN_AS:
            location = lowered.values.get(_WRITTEN_AS[prefix])
        if location is not None:
            break
    if location is None:  # about the plan as a whole (a block is missing): file:1:1, no line quoted
        return PlanError(issue.message, location=SourceLocation(lowered.plan_file.filename, 1, 1), hint=issue.hint)
    return PlanError(issue.message, location=location, hint=issue.hint, source=lowered.plan_file.source)


def build(
    plan_file: ast.PlanFile,
    *,
    base_dir: Path | None = None,
    known_strategies: Collection[str] | None = None,
    source_name: str | None = None,
    check_uses: Callable[[Plan], list[SpecIssue]] | None = None,
) -> Plan:
    """Validate a parsed plan; raise every problem in the file as one located PlanErrors.

    ``check_uses(plan)`` (the strategy registry's option validation) may add issues about the
    ``use`` blocks, addressed ``("uses", i, "options", key)``; they are located like the rest.
    """
    lowered = lower(plan_file)
    errors = list(lowered.errors)
    plan = None
    try:
        plan = build_plan(
            lowered.raw, source=source_name or plan_file.filename, base_dir=base_dir, known_strategies=known_strategies
        )
    except SpecError as failure:
        for issue in failure.issues:
            missing = _MISSING_BLOCK.fullmatch(issue.message)
            if missing and missing.group(1) in lowered.meant_blocks:
                continue  # already reported as the misspelled block
            errors.append(locate(issue, lowered))
    if plan is not None and check_uses is not None:
        errors += [locate(issue, lowered) for issue in check_uses(plan)]
    if errors:
        raise PlanErrors(in_source_order(errors))
    assert plan is not None
    return plan
