"""The ``.plan`` grammar (``grammar.lark``), compiled once: an LALR parser with a contextual lexer.

The parser (:mod:`planc.dsl.parser`) parses with it; the syntax-error wording
(:mod:`planc.dsl.syntax_errors`) parses its sample bad inputs with it.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from lark import Lark, Token


class _CommentSink:
    """Receives COMMENT tokens from the lexer (lark ignores them otherwise). One per process, as
    the parser is: ``parse`` is not meant to be called from several threads at once."""

    def __init__(self) -> None:
        self.tokens: list[Token] = []

    def __call__(self, token: Token) -> Token:
        self.tokens.append(token)
        return token


COMMENTS = _CommentSink()


@lru_cache(maxsize=1)
def lark_parser() -> Lark:
    """The grammar, compiled once per process (about 25 ms)."""
    grammar = resources.files("planc.dsl").joinpath("grammar.lark").read_text(encoding="utf-8")
    return Lark(
        grammar, parser="lalr", lexer="contextual", maybe_placeholders=False, lexer_callbacks={"COMMENT": COMMENTS}
    )
