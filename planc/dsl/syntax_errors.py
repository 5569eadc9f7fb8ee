"""Turn lark's syntax errors into messages a person can act on.

lark says *which token* it did not expect in *which parser state*. To say what the writer most
likely meant, the state is matched against small bad inputs (lark's ``match_examples``): each
label below lists snippets that fail in the states it covers, and its handler words the message,
looking at the offending token and, through a tolerant scan of the text (:func:`scan`), at what
came before it (the key being set, the block still open).
"""

from __future__ import annotations

from functools import lru_cache

from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from planc.dsl.grammar import lark_parser
from planc.dsl.syntax_hints import CHARACTER_HINTS, HANDLERS, generic, unexpected_character
from planc.dsl.syntax_scan import Context, scan
from planc.errors import PlanError

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
        special = unexpected_character(context)
        if special is not None:
            return special
    label = match_examples(error)
    if isinstance(error, UnexpectedCharacters):
        return context.make(f"unexpected character {context.described()}", CHARACTER_HINTS.get(label or ""))
    handler = HANDLERS.get(label, generic) if label else generic
    return handler(context)
