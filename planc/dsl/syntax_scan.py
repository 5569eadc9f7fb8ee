"""What a syntax-error message needs to know about the text around the error.

A tolerant scan of the text up to the error (:func:`scan`: it never fails, whatever the input),
the blocks and lists still open there (:func:`open_blocks`), and the :class:`Context` the
handlers of :mod:`planc.dsl.syntax_hints` word their messages from.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from lark.exceptions import UnexpectedInput, UnexpectedToken

from planc.errors import PlanError, SourceLocation

KNOWN_BLOCKS = ("model", "hardware", "train", "layout", "checkpoint")

VALUE_FORMS = "a number (8), a word (auto, gelu), a quoted string, a quantity (80 GiB) or a list ([a, b])"


# -- a tolerant scan of the text, for context ---------------------------------------------------

_SCAN_RE = re.compile(
    r"""
    (?P<space>[ \t\f\r]+) | (?P<newline>\n) | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*") | (?P<badstring>"(?:[^"\\\n]|\\.)*)
  | (?P<punct>[{}\[\]=,]) | (?P<word>[^\s{}\[\]=,"\#]+)
""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Tok:
    kind: str  # "string", "badstring", "punct", "word"
    text: str
    line: int
    column: int
    offset: int


def scan(text: str, stop: int | None = None) -> list[Tok]:
    """The significant tokens of ``text`` up to offset ``stop``; never fails on any input."""
    stop = len(text) if stop is None else stop
    tokens, line, line_start, position = [], 1, 0, 0
    while position < stop:
        match = _SCAN_RE.match(text, position, stop)
        if match is None:  # a character no pattern takes (e.g. a lone backslash-newline): skip it
            position += 1
            continue
        kind = match.lastgroup or ""
        if kind == "newline":
            line, line_start = line + 1, match.end()
        elif kind not in ("space", "comment"):
            tokens.append(Tok(kind, match.group(), line, position - line_start + 1, position))
        position = match.end()
    return tokens


@dataclass(frozen=True)
class OpenBlock:
    name: str
    brace: Tok


def open_blocks(tokens: list[Tok]) -> tuple[list[OpenBlock], list[Tok]]:
    """The blocks (with their ``{``) and the lists (their ``[``) still open after ``tokens``."""
    blocks: list[OpenBlock] = []
    lists: list[Tok] = []
    header_start = 0
    for index, tok in enumerate(tokens):
        if tok.text == "{" and tok.kind == "punct":
            words = [t.text for t in tokens[header_start:index] if t.kind in ("word", "string")]
            name = words[0] if words else "unnamed"
            name = f"use {words[1]}" if name == "use" and len(words) > 1 else name
            blocks.append(OpenBlock(name, tok))
        elif tok.text == "}" and tok.kind == "punct":
            if blocks:
                blocks.pop()
            lists.clear()
            header_start = index + 1
        elif tok.text == "[" and tok.kind == "punct":
            lists.append(tok)
        elif tok.text == "]" and tok.kind == "punct" and lists:
            lists.pop()
        if blocks and tok.text in ("{", "}"):
            header_start = index + 1
    return blocks, lists


# -- building the error -------------------------------------------------------------------------


@dataclass
class Context:
    """What a handler knows: the error, the text, and the tokens before the error."""

    error: UnexpectedInput
    text: str
    filename: str
    before: list[Tok]

    @property
    def found(self) -> str:
        """The offending text: a token's value, a character, or '' at the end of the file."""
        if isinstance(self.error, UnexpectedToken):
            return "" if self.error.token.type == "$END" else str(self.error.token)
        return self.text[self.position]

    @property
    def position(self) -> int:
        """Offset of the error in the text (lark always sets it for these errors)."""
        return self.error.pos_in_stream or 0

    @property
    def at_end(self) -> bool:
        return isinstance(self.error, UnexpectedToken) and self.error.token.type == "$END"

    @property
    def found_kind(self) -> str:
        return self.error.token.type if isinstance(self.error, UnexpectedToken) else "CHAR"

    def here(self, length: int | None = None) -> SourceLocation:
        if self.at_end:
            last = self.before[-1] if self.before else None
            if last is None:
                return SourceLocation(self.filename, 1, 1)
            return SourceLocation(
                self.filename, last.line, last.column + len(last.text), last.column + len(last.text) + 1
            )
        length = length if length is not None else max(1, len(self.found.split("\n")[0]))
        return SourceLocation(self.filename, self.error.line, self.error.column, self.error.column + length)

    def at(self, tok: Tok) -> SourceLocation:
        return SourceLocation(self.filename, tok.line, tok.column, tok.column + len(tok.text))

    def previous(self, back: int = 1) -> Tok | None:
        return self.before[-back] if len(self.before) >= back else None

    def described(self) -> str:
        return describe_found(self.found, self.found_kind)

    def make(self, message: str, hint: str | None = None, location: SourceLocation | None = None) -> PlanError:
        return PlanError(message, location=location or self.here(), hint=hint, source=self.text)


def describe_found(text: str, kind: str) -> str:
    if kind == "$END" or text == "":
        return "the end of the file"
    if kind == "STRING":
        return f"the string {text}"
    if len(text) == 1 and not text.isprintable():
        return f"the {invisible_kind(text)} U+{ord(text):04X}"
    return f"'{text}'"


def invisible_kind(char: str) -> str:
    """How to call a character that does not print: control characters are category Cc."""
    category = unicodedata.category(char)
    if category == "Cc":
        return "control character"
    if category.startswith("Z"):
        return "space character"
    return "invisible character"
