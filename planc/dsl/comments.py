"""Attach comments to the nodes they belong to, so ``planc fmt`` can keep every one of them.

The lexer collects comments apart from the tree. This pass gives each a home, by position:

- after a value on the entry's last line            -> that entry's ``trailing``
- on the line of a block's ``{``, before any entry   -> the block's ``header_comment``
- after ``}`` (or a body-less header) on its line    -> the block's ``trailing``
- on a line of its own inside a body                 -> ``leading`` of the next entry, or the
                                                        body's ``closing`` after the last entry
- on a line of its own outside blocks                -> ``leading`` of the next block, or the
                                                        file's ``trailing`` after the last block
- above the first block, set apart by an empty line  -> the file's ``header`` (it stays on top
                                                        when fmt reorders blocks)

Anything else (a comment inside a multi-line list, or between a block's keyword and its ``{``)
is kept as a leading comment of the entry or block it sits in. Every comment ends up somewhere;
``blank_before`` records an empty line above each comment, entry and block header.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import replace

from planc.dsl.ast import AnyBlock, Body, Comment, Node, PlanFile


def attach_comments(plan: PlanFile, comments: Sequence[Comment]) -> PlanFile:
    """Return ``plan`` with every comment attached (linear in the number of comments and nodes)."""
    lines = plan.source.split("\n")
    indent = [len(text) - len(text.lstrip()) for text in lines]  # columns before a line's first token

    def blank_before(node: Node) -> bool:
        """The node begins its line and the line above it is empty."""
        line = node.line
        if not 1 < line <= len(lines) or node.column - 1 > indent[line - 1]:
            return False
        return not lines[line - 2].strip()

    comments = [replace(c, blank_before=blank_before(c)) for c in sorted(comments, key=lambda c: c.start)]
    blocks = list(plan.blocks)
    top_level: list[list[Comment]] = [[] for _ in range(len(blocks) + 1)]  # before block i; last: after all
    inside: list[list[Comment]] = [[] for _ in blocks]
    trailing: dict[int, Comment] = {}

    index = 0  # the first block that does not end before the comment
    for comment in comments:
        while index < len(blocks) and blocks[index].end <= comment.start:
            index += 1
        previous = blocks[index - 1] if index > 0 else None
        if index < len(blocks) and blocks[index].start <= comment.start:
            inside[index].append(comment)
        elif previous is not None and previous.end_line == comment.line and index - 1 not in trailing:
            trailing[index - 1] = comment
        else:
            top_level[index].append(comment)

    new_blocks = []
    for i, block in enumerate(blocks):
        block = _attach_inside(block, inside[i], blank_before)
        new_blocks.append(
            replace(
                block,
                leading=tuple(top_level[i]) + block.leading,
                trailing=trailing.get(i),
                blank_before=blank_before(block),
            )
        )

    header: tuple[Comment, ...] = ()
    if new_blocks:
        header, leading = _split_header(new_blocks[0])
        new_blocks[0] = replace(new_blocks[0], leading=leading)
    return replace(plan, blocks=tuple(new_blocks), header=header, trailing=tuple(top_level[-1]))


def _split_header(block: AnyBlock) -> tuple[tuple[Comment, ...], tuple[Comment, ...]]:
    """Comments above the first block, up to its last empty line, describe the file, not the block."""
    leading = block.leading
    if block.blank_before:
        return leading, ()
    for cut in range(len(leading) - 1, 0, -1):
        if leading[cut].blank_before:
            return leading[:cut], leading[cut:]
    return (), leading


def _attach_inside(block: AnyBlock, comments: list[Comment], blank_before: Callable[[Node], bool]) -> AnyBlock:
    body = block.body
    leading: list[Comment] = []
    header_comment = None
    in_body: list[Comment] = []
    for comment in comments:
        if body is None or comment.start < body.start:
            # Between the keyword and the brace: keep it above the block, except one on the
            # header line, which the formatter writes after the brace.
            if comment.line == block.line and header_comment is None:
                header_comment = comment
            else:
                leading.append(comment)
        else:
            in_body.append(comment)
    if body is not None:
        body, header_from_body = _attach_body(body, in_body, blank_before)
        if header_from_body is not None:
            if header_comment is None:
                header_comment = header_from_body
            else:
                leading.append(header_from_body)
    return replace(block, body=body, leading=tuple(leading), header_comment=header_comment)


def _attach_body(
    body: Body, comments: list[Comment], blank_before: Callable[[Node], bool]
) -> tuple[Body, Comment | None]:
    entries = body.entries
    starts = [e.start for e in entries]
    leading: list[list[Comment]] = [[] for _ in entries]
    trailing: dict[int, Comment] = {}
    closing: list[Comment] = []
    header_comment = None
    for comment in comments:
        following = bisect_left(starts, comment.start)  # entries[following:] start after the comment
        previous = entries[following - 1] if following > 0 else None
        if (
            previous is not None
            and previous.end <= comment.start
            and previous.end_line == comment.line
            and following - 1 not in trailing
        ):
            trailing[following - 1] = comment
        elif previous is not None and comment.start < previous.end:
            leading[following - 1].append(comment)  # inside a multi-line list: keep it above the entry
        elif comment.line == body.line and header_comment is None:
            header_comment = comment
        elif following < len(entries):
            leading[following].append(comment)
        else:
            closing.append(comment)
    new_entries = tuple(
        replace(e, leading=tuple(leading[i]), trailing=trailing.get(i), blank_before=blank_before(e))
        for i, e in enumerate(entries)
    )
    return replace(body, entries=new_entries, closing=tuple(closing)), header_comment
