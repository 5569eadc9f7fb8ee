"""``parse(text, filename) -> PlanFile``: the text of a ``.plan`` file to its syntax tree.

Three small steps:

1. lark (LALR(1), contextual lexer) checks the syntax; its errors become located
   :class:`~planc.errors.PlanError` messages chosen in :mod:`planc.dsl.syntax_errors`;
2. :class:`ToAst` turns the lark tree into frozen :mod:`planc.dsl.ast` nodes, reading every
   literal (numbers, units, escapes) and collecting what is malformed;
3. comments are attached (:mod:`planc.dsl.comments`), then duplicate keys and blocks are
   reported at their second occurrence, pointing to the first.

Every problem found in steps 2 and 3 is reported together as one :class:`~planc.errors.PlanErrors`.
"""

from __future__ import annotations

from typing import Any, TypedDict

from lark import Token, Transformer
from lark.exceptions import UnexpectedInput, VisitError

from planc.dsl import ast
from planc.dsl.comments import attach_comments
from planc.dsl.grammar import COMMENTS, lark_parser
from planc.dsl.literals import (
    LiteralError,
    check_quantity_range,
    check_unit,
    parse_atom,
    parse_number,
    parse_string,
    split_quantity,
)
from planc.errors import PlanError, PlanErrors, SourceLocation


def parse(text: str, filename: str = "<plan>") -> ast.PlanFile:
    """Parse ``text`` into a :class:`~planc.dsl.ast.PlanFile`, or raise a located PlanError."""
    from planc.dsl.syntax_errors import describe_syntax_error

    # Windows (CRLF) and classic Mac (CR) line ends read as line ends: otherwise a '#' comment
    # on a CR-only file would run to the end of the file and hide everything after it.
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    parser = lark_parser()
    COMMENTS.tokens = []
    try:
        tree = parser.parse(text)
    except UnexpectedInput as error:
        raise describe_syntax_error(error, text, filename) from None
    except RecursionError:  # pragma: no cover - the LALR parser is iterative; kept as a last guard
        raise PlanError("the file is nested too deeply to read", location=SourceLocation(filename, 1, 1)) from None
    comment_tokens, COMMENTS.tokens = COMMENTS.tokens, []

    builder = ToAst(filename, text)
    try:
        plan = builder.transform(tree)
    except VisitError as error:  # pragma: no cover - ToAst reports problems, it does not raise them
        raise error.orig_exc from None
    comments = [builder.comment(token) for token in comment_tokens]
    plan = attach_comments(plan, comments)
    errors = builder.errors + find_duplicates(plan)
    if errors:
        raise PlanErrors(in_source_order(errors))
    return plan


#: More errors than this in one file are summarised, not listed (a wrong file, not a wrong plan).
MAX_ERRORS_SHOWN = 50


def in_source_order(errors: list[PlanError]) -> list[PlanError]:
    """Errors sorted by position, duplicates dropped, the list cut at MAX_ERRORS_SHOWN."""
    unique: dict[tuple, PlanError] = {}
    for error in errors:
        loc = error.location
        unique.setdefault((loc.line, loc.col, error.message) if loc else (0, 0, error.message), error)
    ordered = sorted(unique.values(), key=lambda e: (e.location.line, e.location.col) if e.location else (0, 0))
    if len(ordered) > MAX_ERRORS_SHOWN:
        rest = len(ordered) - MAX_ERRORS_SHOWN
        ordered = ordered[:MAX_ERRORS_SHOWN] + [
            PlanError(f"... and {rest:,} more problems in this file", hint="fix the ones above first")
        ]
    return ordered


class Span(TypedDict):
    """The position keywords every node takes."""

    line: int
    column: int
    end_line: int
    end_column: int


def _span(first: Any, last: Any | None = None) -> Span:
    """Position keywords for a node from its first and last token or node (both carry
    ``line``/``column``/``end_line``/``end_column`` with the same meaning)."""
    last = first if last is None else last
    return Span(line=first.line, column=first.column, end_line=last.end_line, end_column=last.end_column)


#: What a rule method receives: the rule's children (tokens and nodes already transformed).
Children = list[Any]


class ToAst(Transformer):
    """lark tree -> :mod:`planc.dsl.ast` nodes. One method per grammar rule (see ``RULE_NODES``).

    Malformed literals do not stop the walk: each becomes a :class:`PlanError` in ``errors`` and
    a placeholder word, so one run reports every such mistake in the file.
    """

    def __init__(self, filename: str, source: str) -> None:
        super().__init__(visit_tokens=False)
        self.filename = filename
        self.source = source
        self.errors: list[PlanError] = []

    # -- helpers -------------------------------------------------------------------------

    def location(self, line: int, column: int, length: int = 1) -> SourceLocation:
        return SourceLocation(self.filename, line, column, column + max(1, length))

    def fail(self, token: Token, problem: LiteralError, base_offset: int = 0) -> None:
        span = _span(token)  # tokens from the parser always carry their position
        column = span["column"] + base_offset + problem.offset
        length = problem.length if problem.length is not None else len(token) - base_offset - problem.offset
        self.errors.append(
            PlanError(
                problem.message,
                location=self.location(span["line"], column, length),
                hint=problem.hint,
                source=self.source,
            )
        )

    def name(self, token: Token) -> ast.Name:
        return ast.Name(text=str(token), **_span(token))

    def comment(self, token: Token) -> ast.Comment:
        return ast.Comment(text=str(token).rstrip("\r\t "), **_span(token))

    # -- file and blocks -----------------------------------------------------------------

    def start(self, children: Children) -> ast.PlanFile:
        lines = self.source.split("\n")
        return ast.PlanFile(
            filename=self.filename,
            source=self.source,
            blocks=tuple(children),
            line=1,
            column=1,
            end_line=len(lines),
            end_column=len(lines[-1]) + 1,
        )

    def model_block(self, children: Children) -> ast.ModelBlock:
        keyword, *rest = children
        label = rest[0] if len(rest) == 2 else None
        return ast.ModelBlock(
            keyword=self.name(keyword),
            label=self.string_node(label) if label else None,
            body=rest[-1],
            **_span(keyword, rest[-1]),
        )

    def model_from_block(self, children: Children) -> ast.ModelBlock:
        keyword, _from, path, *rest = children
        body = rest[0] if rest else None
        return ast.ModelBlock(
            keyword=self.name(keyword),
            source=self.string_node(path),
            body=body,
            **_span(keyword, body if body is not None else path),
        )

    def use_block(self, children: Children) -> ast.UseBlock:
        keyword, strategy, *rest = children
        body = rest[0] if rest else None
        return ast.UseBlock(
            keyword=self.name(keyword),
            strategy=self.name(strategy),
            body=body,
            **_span(keyword, body if body is not None else strategy),
        )

    def block(self, children: Children) -> ast.Block:
        name, body = children
        return ast.Block(block_name=self.name(name), body=body, **_span(name, body))

    def body(self, children: Children) -> ast.Body:
        lbrace, *entries, rbrace = children
        return ast.Body(entries=tuple(entries), **_span(lbrace, rbrace))

    def entry(self, children: Children) -> ast.Entry:
        key, value = children
        return ast.Entry(key=self.name(key), value=value, **_span(key, value))

    # -- values --------------------------------------------------------------------------

    def list(self, children: Children) -> ast.ListValue:
        lsqb, *items, rsqb = children
        return ast.ListValue(items=tuple(items), **_span(lsqb, rsqb))

    def string_node(self, token: Token) -> ast.String:
        try:
            value = parse_string(str(token))
        except LiteralError as problem:
            self.fail(token, problem)
            value = ""
        return ast.String(value=value, raw=str(token), **_span(token))

    def string(self, children: Children) -> ast.String:
        return self.string_node(children[0])

    def quantity(self, children: Children) -> ast.Quantity | ast.Word:
        token = children[0]
        number_text, unit_offset, unit = split_quantity(str(token))
        try:
            if unit in ("e", "E") and unit_offset == len(number_text):
                raise LiteralError(
                    f"'{token}' is not a valid number", "an exponent needs digits, e.g. 1e3 or 3e-4", 0, len(token)
                )
            number = parse_number(number_text)
            check_unit(unit)
            check_quantity_range(number, unit, str(token))
        except LiteralError as problem:
            self.fail(token, problem, base_offset=unit_offset if problem.message.startswith("unknown unit") else 0)
            return ast.Word(value=str(token), **_span(token))
        return ast.Quantity(number=number, number_raw=number_text, unit=unit, **_span(token))

    def atom(self, children: Children) -> ast.Number | ast.Word:
        token = children[0]
        try:
            value = parse_atom(str(token))
        except LiteralError as problem:
            self.fail(token, problem)
            return ast.Word(value=str(token), **_span(token))
        if isinstance(value, str):
            return ast.Word(value=value, **_span(token))
        return ast.Number(value=value, raw=str(token), **_span(token))

    def true(self, children: Children) -> ast.Bool:
        return ast.Bool(value=True, **_span(children[0]))

    def false(self, children: Children) -> ast.Bool:
        return ast.Bool(value=False, **_span(children[0]))

    def auto(self, children: Children) -> ast.Auto:
        return ast.Auto(**_span(children[0]))

    def __default__(self, data, children, meta):  # pragma: no cover - RULE_NODES covers every rule
        raise AssertionError(f"grammar rule {data!r} has no AST node class")


# -- duplicates ----------------------------------------------------------------------------


def block_identity(block: ast.AnyBlock) -> str:
    """What makes two blocks the same block: the name, or ``use NAME``."""
    return f"use {block.strategy.text}" if isinstance(block, ast.UseBlock) else block.name


def block_anchor(block: ast.AnyBlock) -> ast.Name:
    """The name node an error about the whole block points at."""
    if isinstance(block, ast.Block):
        return block.block_name
    if isinstance(block, ast.UseBlock):
        return block.strategy
    return block.keyword


def find_duplicates(plan: ast.PlanFile) -> list[PlanError]:
    """A key set twice in a block, or a block written twice: reported at the second, naming the first."""
    errors = []
    seen_blocks: dict[str, ast.AnyBlock] = {}
    for block in plan.blocks:
        identity = block_identity(block)
        first = seen_blocks.setdefault(identity, block)
        if first is not block:
            anchor, first_anchor = block_anchor(block), block_anchor(first)
            what = (
                f"strategy '{block.strategy.text}' is used"
                if isinstance(block, ast.UseBlock)
                else f"the {identity} block appears"
            )
            errors.append(
                _located(
                    plan, anchor, f"{what} twice", f"the first is at line {first_anchor.line}; merge the two into one"
                )
            )
        seen_keys: dict[str, ast.Entry] = {}
        for entry in block.entries:
            earlier = seen_keys.setdefault(entry.key.text, entry)
            if earlier is not entry:
                errors.append(
                    _located(
                        plan,
                        entry.key,
                        f"duplicate key '{entry.key.text}' in the {block.name} block",
                        f"it is already set at line {earlier.key.line} "
                        f"({earlier.key.text} = {_raw(earlier.value)}); keep one of the two",
                    )
                )
    return errors


def _raw(value: ast.Value) -> str:
    if isinstance(value, ast.ListValue):
        return "[" + ", ".join(item.raw for item in value.items) + "]"
    return value.raw


def _located(plan: ast.PlanFile, node: ast.Node, message: str, hint: str) -> PlanError:
    end = node.end_column if node.end_line == node.line else node.column + 1
    return PlanError(
        message, location=SourceLocation(plan.filename, node.line, node.column, end), hint=hint, source=plan.source
    )
