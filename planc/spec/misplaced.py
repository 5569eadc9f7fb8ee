"""A key written in the wrong block: say which block it belongs in, and report it once.

``micro_batch`` written in ``layout`` is a train key; ``microbatch`` there misspells it. The
unknown-key error says so, and the "missing key" error the same mistake would cause in the right
block (``global_batch`` moved to ``layout`` leaves ``train`` without it) is dropped: one mistake,
one error. ``keys`` maps each block to the keys it accepts (:func:`planc.spec.build.block_keys`).
"""

from __future__ import annotations

from typing import Any

from planc.errors import close_names, did_you_mean, one_of
from planc.spec.issues import SpecIssue


def unknown_key_hint(block: str, key: str, keys: dict[str, list[str]]) -> str:
    """A misspelling of one of the block's keys; else the block the key belongs in, with the key
    it misspells there; else the block's keys."""
    here = did_you_mean(key, keys[block])
    if here:
        return here
    meant = meant_elsewhere(block, key, keys)
    if meant is None:
        return one_of(keys[block])
    other, name = meant
    if name == key:
        return f"'{key}' belongs in the {other} block: move it there"
    return f"did you mean '{name}'? it belongs in the {other} block"


def meant_elsewhere(block: str, key: str, keys: dict[str, list[str]]) -> tuple[str, str] | None:
    """(block, key) of another block that an unknown ``key`` of ``block`` means: the same name, or
    the one it misspells (None: neither)."""
    others = [b for b in keys if b != block]
    for other in others:
        if key in keys[other]:
            return other, key
    for other in others:
        close = close_names(key, keys[other], limit=1)
        if close:
            return other, close[0]
    return None


def explained_elsewhere(raw: dict[str, Any], issues: list[SpecIssue], keys: dict[str, list[str]]) -> list[SpecIssue]:
    """``issues`` without "the X block is missing 'k'" where k was written in (or misspelled into)
    another block, whose unknown-key error already says it belongs in X."""
    moved = set()
    for block, values in raw.items():
        if block not in keys or not isinstance(values, dict):
            continue
        for key in values:
            if key in keys[block] or did_you_mean(key, keys[block]):
                continue
            meant = meant_elsewhere(block, key, keys)
            if meant is not None:
                moved.add(f"the {meant[0]} block is missing '{meant[1]}'")
    return [i for i in issues if i.message not in moved]
