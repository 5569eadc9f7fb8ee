"""Turn lark's syntax errors into messages a person can act on.

lark says *which token* it did not expect in *which parser state*. To say what the writer most
likely meant, the state is matched against small bad inputs (lark's ``match_examples``): each
label below lists snippets that fail in the states it covers, and its handler words the message,
looking at the offending token and, through a tolerant scan of the text (:func:`scan`), at what
came before it (the key being set, the block still open).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from planc.errors import PlanError, SourceLocation, did_you_mean, one_of

KNOWN_BLOCKS = ("model", "hardware", "train", "layout", "checkpoint")

#: label -> snippets that fail in the parser states the label covers. Order matters only when
#: two labels share a state; each state appears under one label here.
EXAMPLES: dict[str, list[str]] = {
    "expected_equals": ["model { layers 4 }", "model { layers }"],
    "missing_value": ["model { layers = }", "model { layers = = 4 }"],
    "after_value": [
        "model { layers = 4 = 3 }",
        'model { a = "x" = 3 }',
        "model { a = 80 GiB 3 }",
        "model { a = true = 3 }",
        "model { a = false = 3 }",
        "model { a = auto = 3 }",
        "model { a = [1] = 3 }",
        "model { a = 4, b = 2 }",
        "model { a = [1], b = 2 }",
        "model { a = 1",
    ],
    "expected_key": ['model { "x" = 1 }', "model { = 1 }"],
    "top_level": ["}", "model { } }", 'model from "x" }', "use foo }"],
    "after_block_name": ["hardware = 4", "hardware"],
    "after_model": ["model = 4", "model"],
    "model_from_path": ["model from x", "model from"],
    "after_model_label": ['model "x" "y"', 'model "x"'],
    "use_name": ['use "x"', "use"],
    "after_use_name": ["use foo = 3"],
    "after_model_from": ['model from "x" "y"'],
    "list_item": ["model { a = [[1]] }", "model { a = [1,, 2] }", "model { a = ["],
    "list_after_item": [
        "model { a = [1 2] }",
        "model { a = [1, 2 }",
        'model { a = ["x" 2] }',
        "model { a = [80 GiB 2] }",
        "model { a = [true 2] }",
        "model { a = [false 2] }",
        "model { a = [auto 2] }",
        "model { a = [1, 2",
    ],
}

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
        return f"the {_invisible_kind(text)} U+{ord(text):04X}"
    return f"'{text}'"


def _invisible_kind(char: str) -> str:
    """How to call a character that does not print: control characters are category Cc."""
    category = unicodedata.category(char)
    if category == "Cc":
        return "control character"
    if category.startswith("Z"):
        return "space character"
    return "invisible character"


def _in_context(examples: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each example as written and after something of its kind, since the LALR state also
    depends on how deep the stack is: the first entry of a block fails in a different state from
    the second, the first block in a different state from the second."""
    varied = {}
    for label, snippets in examples.items():
        more = []
        for snippet in snippets:
            more.append(snippet)
            if snippet.startswith("model {") and not snippet.startswith("model { }"):
                more.append(snippet.replace("model {", 'model { z = "v"', 1))
            more.append("model { }\n" + snippet)
            more.append("use foo\n" + snippet)
        varied[label] = more
    return varied


Signature = tuple[int, object, frozenset]


def _signature(error: UnexpectedInput) -> Signature | None:
    """Where the parser stood: stack depth, LALR state, and the terminals it would accept."""
    state = error.state
    if state is None or not hasattr(state, "state_stack"):
        return None
    parser = getattr(error, "interactive_parser", None)
    accepts = frozenset(parser.accepts()) if parser is not None else frozenset()
    return (len(state.state_stack), state.position, accepts)


@lru_cache(maxsize=1)
def _example_signatures() -> tuple[tuple[Signature, str], ...]:
    """Parse every example once and remember the state it fails in."""
    from planc.dsl.parser import lark_parser

    found = []
    for label, snippets in _in_context(EXAMPLES).items():
        for snippet in snippets:
            try:
                lark_parser().parse(snippet)
            except UnexpectedInput as failure:
                signature = _signature(failure)
                if signature is not None:
                    found.append((signature, label))
            else:  # pragma: no cover - a test checks every example fails
                raise AssertionError(f"syntax example {snippet!r} parses")
    return tuple(found)


def match_examples(error: UnexpectedInput) -> str | None:
    """The label whose examples fail where ``error`` did.

    This is lark's ``match_examples`` idea with three tiers: the same state and stack depth and
    the same acceptable terminals; else the same state and depth; else the same acceptable
    terminals (LALR states also encode which kind of block came before, which no finite list of
    examples covers). The example states are computed once, not re-parsed for every error (lark
    1.3's own version also crashes formatting a debug message when states differ only in what
    they accept).
    """
    signature = _signature(error)
    if signature is None:
        return None
    best: tuple[int, str] | None = None
    for example, label in _example_signatures():
        if example == signature:
            return label
        tier = 1 if example[:2] == signature[:2] else 2 if example[2] == signature[2] else None
        if tier is not None and (best is None or tier < best[0]):
            best = (tier, label)
    return best[1] if best else None


def describe_syntax_error(error: UnexpectedInput, text: str, filename: str) -> PlanError:
    """The PlanError for lark's ``error`` in ``text``."""
    position = error.pos_in_stream if error.pos_in_stream is not None else len(text)
    if isinstance(error, UnexpectedToken) and error.token.type == "$END":
        position = len(text)
    context = Context(error, text, filename, scan(text, position))
    if isinstance(error, UnexpectedCharacters):
        special = _unexpected_character(context)
        if special is not None:
            return special
    label = match_examples(error)
    if isinstance(error, UnexpectedCharacters):
        return context.make(f"unexpected character {context.described()}", CHARACTER_HINTS.get(label or ""))
    handler = HANDLERS.get(label, _generic) if label else _generic
    return handler(context)


#: What was expected where a character no token starts with was found.
CHARACTER_HINTS = {
    "expected_equals": "expected '=' after the key: key = value",
    "missing_value": f"expected a value: {VALUE_FORMS}",
    "after_value": "expected the next key or '}'",
    "expected_key": "expected a key or '}'",
    "top_level": "expected a block: model { ... }, hardware { ... }, ...",
    "list_item": "expected a list item or ']'",
    "list_after_item": "expected ',' or ']'",
}


# -- characters no token starts with -------------------------------------------------------------


def _unexpected_character(ctx: Context) -> PlanError | None:
    char = ctx.found
    line_text = ctx.text.split("\n")[ctx.error.line - 1] if ctx.error.line else ""
    if char == '"':
        rest = len(line_text) - ctx.error.column + 1
        return ctx.make(
            "unterminated string: the closing '\"' is missing",
            "a string must end on the line where it starts; add '\"' after the text",
            ctx.here(rest),
        )
    rest_of_line = line_text[ctx.error.column :]
    if char == "'":
        closing = rest_of_line.find("'")
        if closing < 0:
            return ctx.make("strings use double quotes, not single quotes", "write \"...\" instead of '...'")
        inner = rest_of_line[:closing]
        return ctx.make("strings use double quotes, not single quotes", f'write "{inner}"', ctx.here(closing + 2))
    if char == ":":
        key = ctx.previous()
        example = f"{key.text} = {rest_of_line.split('#')[0].strip() or '...'}" if key else "layers = 4"
        return ctx.make("expected '=', found ':'", f"keys and values are joined with '=': {example}")
    if char == ";":
        return ctx.make(
            "unexpected ';'", "entries need no separator: put them on separate lines or separate them with spaces"
        )
    following = ctx.text[ctx.position + 1 : ctx.position + 40].lstrip(" \t")
    digits = re.match(r"[0-9][0-9_.eE]*", following)  # ASCII digits: '³'.isdigit() is true
    if char in "+-" and digits:
        number = digits.group()
        return ctx.make(f"a '{char}' must stand right before its number", f"write {char}{number}, not {char} {number}")
    if char == "\\":
        return ctx.make("unexpected '\\' outside a string", 'a backslash may only appear inside "..."')
    if char in "\t\n\r\f ":
        return None
    if unicodedata.category(char) == "Zs":  # a no-break or other wide space, often pasted from a web page
        return ctx.make(
            f"unexpected {unicodedata.name(char, 'space').lower()} (U+{ord(char):04X})",
            "replace it with an ordinary space",
        )
    if not char.isprintable() or unicodedata.category(char).startswith("C"):
        return ctx.make(
            f"unexpected {_invisible_kind(char)} U+{ord(char):04X}",
            "a .plan file is plain text; is this the right file?",
        )
    if ord(char) > 127:
        return ctx.make(
            f"unexpected character '{char}' (U+{ord(char):04X})",
            "keys and bare words are ASCII letters, digits, '_' and '-'; put other text in double quotes",
        )
    return None


# -- one handler per label -----------------------------------------------------------------------


def _expected_equals(ctx: Context) -> PlanError:
    key = ctx.previous()
    key_text = key.text if key else "the key"
    if ctx.found == "{" and key is not None:
        return _missing_close_before(ctx, key)
    if ctx.at_end or ctx.found == "}":
        return ctx.make(f"'{key_text}' has no value", f"write {key_text} = value", ctx.at(key) if key else None)
    return ctx.make(
        f"expected '=' after '{key_text}', found {ctx.described()}",
        f"write {key_text} = {ctx.found if ctx.found_kind != 'LBRACE' else 'value'}",
    )


def _missing_close_before(ctx: Context, name: Tok) -> PlanError:
    """``name {`` inside a block: the block before it was never closed."""
    blocks, _ = open_blocks(ctx.before[:-1])
    if blocks:
        opened = blocks[-1]
        return ctx.make(
            f"missing '}}': the {opened.name} block (opened at line {opened.brace.line}) is not "
            f"closed before the {name.text} block",
            f"add '}}' before line {name.line}",
            ctx.at(name),
        )
    return ctx.make(f"unexpected '{{' after '{name.text}'", None)


def _missing_value(ctx: Context) -> PlanError:
    equals = ctx.previous()
    key = ctx.previous(2)
    key_text = key.text if key else "the key"
    location = ctx.at(equals) if equals is not None else None
    return ctx.make(f"missing value after '{key_text} ='", f"write a value after '=': {VALUE_FORMS}", location)


def _after_value(ctx: Context) -> PlanError:
    blocks, lists = open_blocks(ctx.before)
    if ctx.at_end:
        return _unclosed_at_end(ctx, blocks, lists)
    value = ctx.previous()
    if ctx.found == "=":
        equals, key = ctx.previous(2), ctx.previous(3)
        if value and equals and key and equals.text == "=" and value.kind == "word" and value.line > equals.line:
            return ctx.make(
                f"missing value after '{key.text} ='", f"write a value after '=': {VALUE_FORMS}", ctx.at(equals)
            )
        return ctx.make("unexpected '='", "one entry is key = value; start the next entry with its key")
    if ctx.found == ",":
        return ctx.make(
            "unexpected ','",
            "entries need no commas: separate them with spaces or newlines "
            "(commas only separate list items, as in [a, b])",
        )
    if ctx.found == "{" and value is not None:
        return _missing_close_before(ctx, value)
    if ctx.found_kind in ("STRING", "QUANTITY", "ATOM", "LSQB", "TRUE", "FALSE", "AUTO"):
        return ctx.make(
            f"expected a key or '}}', found {ctx.described()}",
            "a key takes one value; for several, write a list: key = [a, b]",
        )
    return ctx.make(f"expected a key or '}}', found {ctx.described()}", None)


def _unclosed_at_end(ctx: Context, blocks: list[OpenBlock], lists: list[Tok]) -> PlanError:
    if lists:
        return ctx.make("the list is not closed: ']' is missing", "add ']' after the last item", ctx.at(lists[-1]))
    if blocks:
        opened = blocks[-1]
        return ctx.make(
            f"the {opened.name} block is not closed: '}}' is missing at the end of the file",
            "add '}' after its last entry",
            ctx.at(opened.brace),
        )
    return ctx.make("the file ends too early", None)


def _expected_key(ctx: Context) -> PlanError:
    blocks, lists = open_blocks(ctx.before)
    if ctx.at_end:
        return _unclosed_at_end(ctx, blocks, lists)
    if ctx.found == "=":
        return ctx.make("missing key before '='", "write key = value, e.g. layers = 4")
    if ctx.found_kind == "STRING":
        return ctx.make(
            f"expected a key, found the string {ctx.found}",
            f"keys are bare words, without quotes: {ctx.found.strip(chr(34))} = ...",
        )
    return ctx.make(f"expected a key or '}}', found {ctx.described()}", "write key = value, e.g. layers = 4")


def _top_level(ctx: Context) -> PlanError:
    if ctx.found == "}":
        return ctx.make(
            "unexpected '}': no block is open here", "remove it, or check the block above for a '}' too many"
        )
    return ctx.make(
        f"expected a block, found {ctx.described()}",
        "a plan is made of blocks: model { ... }, hardware { ... }, train { ... }, ...",
    )


def _after_block_name(ctx: Context) -> PlanError:
    name = ctx.previous()
    name_text = name.text if name else "?"
    if ctx.found == "=":
        owner = _block_of_key(name_text)
        where = f"the {owner} block" if owner else "a block"
        return ctx.make(
            f"'{name_text} = ...' is outside any block",
            f"put it inside {where}, e.g. {owner or 'train'} {{ {name_text} = ... }}",
            ctx.at(name) if name else None,
        )
    if name_text not in KNOWN_BLOCKS and name is not None:
        return ctx.make(
            f"unknown block '{name_text}'",
            did_you_mean(name_text, [*KNOWN_BLOCKS, "use"]) or one_of([*KNOWN_BLOCKS, "use"]),
            ctx.at(name),
        )
    if ctx.found_kind == "STRING":
        return ctx.make(
            f"only the model block takes a name; the {name_text} block does not",
            f"remove the name: {name_text} {{ ... }}",
        )
    if ctx.found == "from":
        return ctx.make(
            f"only the model block can be read from a file, not the {name_text} block", 'write model from "config.json"'
        )
    return ctx.make(
        f"expected '{{' after '{name_text}', found {ctx.described()}",
        f"a block is written {name_text} {{ key = value ... }}",
    )


def _block_of_key(key: str) -> str | None:
    from planc.spec import BLOCKS, block_keys

    return next((block for block in BLOCKS if key in block_keys(block)), None)


def _after_model(ctx: Context) -> PlanError:
    return ctx.make(
        f"expected '{{', a quoted name or 'from' after 'model', found {ctx.described()}",
        'write model { ... }, model "name" { ... } or model from "config.json"',
    )


def _model_from_path(ctx: Context) -> PlanError:
    return ctx.make(
        f"'model from' needs a quoted path, found {ctx.described()}",
        'write the path in double quotes: model from "configs/my-model/config.json"',
    )


def _after_model_label(ctx: Context) -> PlanError:
    return ctx.make(f"expected '{{' after the model name, found {ctx.described()}", 'write model "name" { ... }')


def _use_name(ctx: Context) -> PlanError:
    if ctx.found_kind == "STRING":
        return ctx.make(
            f"use takes the strategy name without quotes, found {ctx.found}", f"write use {ctx.found.strip(chr(34))}"
        )
    return ctx.make(
        f"expected a strategy name after 'use', found {ctx.described()}",
        "write use NAME { options }; `planc plugins` lists the names",
    )


def _after_use_name(ctx: Context) -> PlanError:
    name = ctx.previous()
    name_text = name.text if name else "NAME"
    return ctx.make(
        f"expected '{{' or a new block after 'use {name_text}', found {ctx.described()}",
        f"options go in braces: use {name_text} {{ key = value }}",
    )


def _after_model_from(ctx: Context) -> PlanError:
    return ctx.make(
        f"expected '{{' or a new block after the config path, found {ctx.described()}",
        'overrides go in braces: model from "config.json" { seq_len = 4096 }',
    )


def _list_item(ctx: Context) -> PlanError:
    _, lists = open_blocks(ctx.before)
    if ctx.found == "[":
        return ctx.make("lists cannot be nested", "a list holds plain values: [1, 2, 3]")
    if ctx.found == ",":
        return ctx.make("missing list item before ','", "remove the extra ','")
    if ctx.at_end or ctx.found == "}":
        where = ctx.at(lists[-1]) if lists else None
        return ctx.make("the list is not closed: ']' is missing", "add ']' after the last item", where)
    return ctx.make(
        f"expected a list item or ']', found {ctx.described()}",
        "list items are numbers, words, quoted strings or quantities, separated by commas",
    )


def _list_after_item(ctx: Context) -> PlanError:
    _, lists = open_blocks(ctx.before)
    if ctx.at_end or ctx.found == "}":
        where = ctx.at(lists[-1]) if lists else None
        return ctx.make("the list is not closed: ']' is missing", "add ']' after the last item", where)
    return ctx.make(
        f"expected ',' or ']' in the list, found {ctx.described()}", "separate list items with commas: [a, b, c]"
    )


def _generic(ctx: Context) -> PlanError:
    blocks, lists = open_blocks(ctx.before)
    if ctx.at_end:
        return _unclosed_at_end(ctx, blocks, lists)
    return ctx.make(f"unexpected {ctx.described()}", None)


HANDLERS: dict[str, Callable[[Context], PlanError]] = {
    "expected_equals": _expected_equals,
    "missing_value": _missing_value,
    "after_value": _after_value,
    "expected_key": _expected_key,
    "top_level": _top_level,
    "after_block_name": _after_block_name,
    "after_model": _after_model,
    "model_from_path": _model_from_path,
    "after_model_label": _after_model_label,
    "use_name": _use_name,
    "after_use_name": _after_use_name,
    "after_model_from": _after_model_from,
    "list_item": _list_item,
    "list_after_item": _list_after_item,
}
