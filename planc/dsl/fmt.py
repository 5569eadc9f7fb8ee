"""``planc fmt``: the canonical text of a parsed plan.

The canonical form: blocks in a fixed order (model, hardware, train, layout, checkpoint, then
``use`` blocks in the order written), one empty line between blocks, two-space indent, one entry
per line, ``=`` aligned within each run of entries that no empty line separates, trailing
comments aligned likewise, every comment kept (comments after the last block set apart by an
empty line), empty lines inside a block kept (at most one),
and every literal written as the user wrote it (``80 GiB``, ``1_000``, ``3e-4``). Only the space
inside a quantity is normalised (``80GiB`` -> ``80 GiB``).

Formatting is a fixed point: ``format_plan(parse(format_plan(parse(x)))) == format_plan(parse(x))``
(tested on every example and on generated plans).
"""

from __future__ import annotations

from planc.dsl import ast

#: The order blocks are written in; ``use`` blocks follow, then any block of an unknown name.
BLOCK_ORDER = ("model", "hardware", "train", "layout", "checkpoint", "use")
INDENT = "  "
#: Space between the widest entry of a run and its aligned trailing comments.
COMMENT_GAP = 2


def format_plan(plan: ast.PlanFile) -> str:
    """The canonical text of ``plan`` (ends with a newline unless the plan is empty)."""
    out: list[str] = []
    if plan.header:
        _comment_lines(out, plan.header, "")
        out.append("")
    blocks = sorted(plan.blocks, key=_block_rank)  # stable: same-rank blocks keep their order
    for index, block in enumerate(blocks):
        if index:
            out.append("")
        _block(out, block)
    if plan.trailing:
        if out:  # set apart: after reordering, the block above may not be the one they followed
            out.append("")
        _comment_lines(out, plan.trailing, "")
    return "\n".join(out) + "\n" if out else ""


def _block_rank(block: ast.AnyBlock) -> int:
    return BLOCK_ORDER.index(block.name) if block.name in BLOCK_ORDER else len(BLOCK_ORDER)


def _comment_lines(
    out: list[str], comments: tuple[ast.Comment, ...], indent: str, first_may_blank: bool = False
) -> None:
    """Full-line comments; an empty line above one is kept, except above the first (unless asked)."""
    for index, comment in enumerate(comments):
        if comment.blank_before and (index or first_may_blank):
            out.append("")
        out.append(indent + comment.text)


def header_text(block: ast.AnyBlock) -> str:
    """``model "gpt3"``, ``model from "config.json"``, ``use powersgd``, ``hardware``."""
    if isinstance(block, ast.ModelBlock):
        if block.source is not None:
            return f"model from {block.source.raw}"
        return f"model {block.label.raw}" if block.label is not None else "model"
    if isinstance(block, ast.UseBlock):
        return f"use {block.strategy.text}"
    return block.name


def _block(out: list[str], block: ast.AnyBlock) -> None:
    _comment_lines(out, block.leading, "")
    if block.leading and block.blank_before:
        out.append("")
    header = header_text(block)
    body = block.body
    if body is None or not (body.entries or body.closing):
        # An empty block fits on one line, unless it has a comment on each of its two lines.
        if not (block.header_comment and block.trailing):
            braces = "" if isinstance(block, ast.UseBlock) or getattr(block, "source", None) else " {}"
            comment = block.header_comment or block.trailing
            out.append(header + braces + (" " * COMMENT_GAP + comment.text if comment else ""))
            return
    out.append(header + " {" + (" " * COMMENT_GAP + block.header_comment.text if block.header_comment else ""))
    if body is not None:
        _entries(out, body.entries)
        _comment_lines(out, body.closing, INDENT, first_may_blank=bool(body.entries))
    out.append("}" + (" " * COMMENT_GAP + block.trailing.text if block.trailing else ""))


def value_text(value: ast.Value) -> str:
    if isinstance(value, ast.ListValue):
        return "[" + ", ".join(item.raw for item in value.items) + "]"
    return value.raw


def _starts_run(entry: ast.Entry) -> bool:
    return entry.blank_before or any(comment.blank_before for comment in entry.leading)


def _entries(out: list[str], entries: tuple[ast.Entry, ...]) -> None:
    runs: list[list[ast.Entry]] = []
    for entry in entries:
        if not runs or _starts_run(entry):
            runs.append([])
        runs[-1].append(entry)
    first_line = True
    for run in runs:
        key_width = max(len(entry.key.text) for entry in run)
        texts = [f"{entry.key.text.ljust(key_width)} = {value_text(entry.value)}" for entry in run]
        commented = [len(text) for text, entry in zip(texts, run) if entry.trailing]
        comment_column = max(commented, default=0) + COMMENT_GAP
        for text, entry in zip(texts, run):
            for comment in entry.leading:
                if comment.blank_before and not first_line:
                    out.append("")
                out.append(INDENT + comment.text)
                first_line = False
            if entry.blank_before and not first_line:
                out.append("")
            line = INDENT + text
            if entry.trailing:
                line = INDENT + text.ljust(comment_column) + entry.trailing.text
            out.append(line)
            first_line = False
