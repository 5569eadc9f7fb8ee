"""The words of a syntax error: one handler per kind of mistake, and the messages for characters
no token starts with (see :mod:`planc.dsl.syntax_errors` for how a mistake is recognised).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

from planc.dsl.syntax_scan import KNOWN_BLOCKS, VALUE_FORMS, Context, OpenBlock, Tok, invisible_kind, open_blocks
from planc.errors import PlanError, did_you_mean, one_of

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


def unexpected_character(ctx: Context) -> PlanError | None:
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
            f"unexpected {invisible_kind(char)} U+{ord(char):04X}",
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


def generic(ctx: Context) -> PlanError:
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
