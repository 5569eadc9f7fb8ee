"""The syntax tree of a ``.plan`` file: frozen dataclasses that keep their source position.

Every node carries ``line``/``column`` (1-based, where it starts) and ``end_line``/``end_column``
(where it ends, exclusive), so any later stage can point an error at the exact text. Values keep
the text the user wrote (``raw``) next to what it means, so ``planc fmt`` writes ``80 GiB`` back as
``80 GiB`` and ``1_000`` as ``1_000``.

Comments are part of the tree (``leading``/``trailing`` on entries and blocks), because the
formatter must not lose them; they play no part in meaning.

:data:`RULE_NODES` says which node class each grammar rule becomes. The transformer in
:mod:`planc.dsl.parser` is built from it, and a test checks that it covers every rule of
``grammar.lark`` (lark passes unknown rules through silently as raw trees).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields


@dataclass(frozen=True, kw_only=True)
class Node:
    """Base of every node: where it starts and ends in the source (1-based; end exclusive)."""

    line: int
    column: int
    end_line: int
    end_column: int

    @property
    def start(self) -> tuple[int, int]:
        return (self.line, self.column)

    @property
    def end(self) -> tuple[int, int]:
        return (self.end_line, self.end_column)


# -- comments --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Comment(Node):
    """``# ...`` up to the end of its line (``text`` includes the ``#``)."""

    text: str
    blank_before: bool = False
    """An empty line separates this comment from what comes before it."""


# -- values ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class String(Node):
    """A double-quoted string: ``value`` with escapes decoded, ``raw`` as written (with quotes)."""

    value: str
    raw: str


@dataclass(frozen=True, kw_only=True)
class Number(Node):
    """``4``, ``1_000``, ``3e-4``, ``-2``: an int when written without '.' and integral (1e3)."""

    value: int | float
    raw: str


@dataclass(frozen=True, kw_only=True)
class Quantity(Node):
    """A number with a unit from :data:`planc.units.UNITS`: ``80 GiB``, ``200 Gb/s``."""

    number: int | float
    number_raw: str
    unit: str

    @property
    def raw(self) -> str:
        return f"{self.number_raw} {self.unit}"


@dataclass(frozen=True, kw_only=True)
class Bool(Node):
    """``true`` or ``false``."""

    value: bool

    @property
    def raw(self) -> str:
        return "true" if self.value else "false"


@dataclass(frozen=True, kw_only=True)
class Auto(Node):
    """The keyword ``auto``: "let the planner choose"."""

    @property
    def raw(self) -> str:
        return "auto"


@dataclass(frozen=True, kw_only=True)
class Word(Node):
    """A bare word such as an enum value: ``gelu``, ``1f1b``, ``zero-bubble``, ``synthetic``."""

    value: str

    @property
    def raw(self) -> str:
        return self.value


Scalar = String | Number | Quantity | Bool | Auto | Word


@dataclass(frozen=True, kw_only=True)
class ListValue(Node):
    """``[a, b, c]``: a flat list of scalars (for plugin options)."""

    items: tuple[Scalar, ...]


Value = Scalar | ListValue


# -- entries and blocks ----------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Name(Node):
    """An identifier: a key, a block name, a strategy name."""

    text: str


@dataclass(frozen=True, kw_only=True)
class Entry(Node):
    """``key = value``."""

    key: Name
    value: Value
    leading: tuple[Comment, ...] = ()
    """Full-line comments just above the entry."""
    trailing: Comment | None = None
    """A comment after the value on the same line."""
    blank_before: bool = False
    """An empty line comes right before the entry's first line."""


@dataclass(frozen=True, kw_only=True)
class Body(Node):
    """``{ entries }`` from the opening to the closing brace."""

    entries: tuple[Entry, ...]
    closing: tuple[Comment, ...] = ()
    """Comments after the last entry, before ``}``."""


@dataclass(frozen=True, kw_only=True)
class BlockNode(Node):
    """What every block has: a body (maybe absent) and the comments around it."""

    body: Body | None
    leading: tuple[Comment, ...] = ()
    """Full-line comments above the block."""
    header_comment: Comment | None = None
    """A comment on the header line (``layout {   # every key may be auto``)."""
    trailing: Comment | None = None
    """A comment after the closing brace (or after a body-less header) on the same line."""
    blank_before: bool = False
    """An empty line separates the block header from its leading comments."""

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def entries(self) -> tuple[Entry, ...]:
        return self.body.entries if self.body is not None else ()


@dataclass(frozen=True, kw_only=True)
class ModelBlock(BlockNode):
    """``model "label" { ... }`` or ``model from "config.json" { overrides }``."""

    keyword: Name
    label: String | None = None
    source: String | None = None
    """The config path of ``model from "..."``."""

    @property
    def name(self) -> str:
        return "model"


@dataclass(frozen=True, kw_only=True)
class UseBlock(BlockNode):
    """``use NAME { options }``: a strategy plugin with its options."""

    keyword: Name
    strategy: Name

    @property
    def name(self) -> str:
        return "use"


@dataclass(frozen=True, kw_only=True)
class Block(BlockNode):
    """``hardware { ... }``, ``train { ... }``, ...: any other block, by name."""

    block_name: Name

    @property
    def name(self) -> str:
        return self.block_name.text


AnyBlock = ModelBlock | UseBlock | Block


@dataclass(frozen=True, kw_only=True)
class PlanFile(Node):
    """A whole ``.plan`` file: its blocks in source order, and the comments outside them."""

    filename: str
    source: str = field(repr=False)
    blocks: tuple[AnyBlock, ...]
    header: tuple[Comment, ...] = ()
    """Comments at the top of the file, set apart from the first block by an empty line."""
    trailing: tuple[Comment, ...] = ()
    """Comments after the last block."""


#: Grammar rule (or alias) -> the node class(es) it becomes.
RULE_NODES: dict[str, tuple[type[Node], ...]] = {
    "start": (PlanFile,),
    "model_block": (ModelBlock,),
    "model_from_block": (ModelBlock,),
    "use_block": (UseBlock,),
    "block": (Block,),
    "body": (Body,),
    "entry": (Entry,),
    "list": (ListValue,),
    "string": (String,),
    "quantity": (Quantity,),
    "atom": (Number, Word),
    "true": (Bool,),
    "false": (Bool,),
    "auto": (Auto,),
}


def walk(node: object) -> Iterator[object]:
    """Every object reachable from ``node`` through dataclass fields and tuples, node first.

    Iterative, so it never recurses however the tree was built.
    """
    stack = [node]
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, tuple):
            stack.extend(reversed(item))
        elif isinstance(item, Node):
            stack.extend(reversed([getattr(item, f.name) for f in fields(item) if f.name != "source"]))
