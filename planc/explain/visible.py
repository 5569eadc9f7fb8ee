"""Text from a plan, made safe to show: a name may hold any character a string escape can write."""

from __future__ import annotations


def visible(text: str) -> str:
    """``text`` with every character that does not print (ESC, newline, BEL, ...) as its Python
    escape (``\\x1b``, ``\\n``): a terminal would obey them, and XML 1.0 forbids most of them."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
