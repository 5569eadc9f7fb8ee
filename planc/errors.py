"""Errors a user can act on.

Every error planc shows a user is a :class:`PlanError`: a message, where it happened
(``file:line:col`` when the input has a location), the offending source line with a caret,
and a hint that says what to do. The CLI prints ``str(error)`` and exits 1; it never shows
a Python traceback for bad input.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class SourceLocation:
    """A 1-based position in a source file; ``end_col`` (exclusive) widens the caret."""

    file: str
    line: int
    col: int
    end_col: int | None = None


class PlanError(Exception):
    """A user-facing error, with an optional location and hint.

    ``source`` is the whole text of the file the location points into; when given, the
    rendered message quotes the line and underlines the span.
    """

    def __init__(
        self,
        message: str,
        *,
        location: SourceLocation | None = None,
        hint: str | None = None,
        source: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.location = location
        self.hint = hint
        self.source = source

    def __str__(self) -> str:
        return render_error(self.message, self.location, self.hint, self.source)


def error_dict(error: PlanError) -> dict[str, object]:
    """An error as ``--json`` prints it: ``{"message", "location", "hint", "errors"}`` (location None
    or ``{"file", "line", "col"}``). ``errors`` lists every error found, the first being the top-level
    one: a list of one for a single error, so a script reads ``["error"]["errors"]`` whatever failed
    (docs/language.md, `planc check`)."""

    def one(e: PlanError) -> dict[str, object]:
        loc = e.location
        where = None if loc is None else {"file": loc.file, "line": loc.line, "col": loc.col}
        return {"message": e.message, "location": where, "hint": e.hint}

    found = error.errors if isinstance(error, PlanErrors) else [error]
    return {**one(error), "errors": [one(e) for e in found]}


class PlanErrors(PlanError):
    """Several independent errors found in one pass, reported together."""

    def __init__(self, errors: list[PlanError]) -> None:
        if not errors:
            raise ValueError("PlanErrors needs at least one error")
        first = errors[0]
        super().__init__(first.message, location=first.location, hint=first.hint, source=first.source)
        self.errors = list(errors)

    def __str__(self) -> str:
        return "\n\n".join(str(e) for e in self.errors)


#: Set to 1 to see the Python traceback behind an internal error or a plugin's failure.
DEBUG_ENV = "PLANC_DEBUG"


def debug_traceback(exc: BaseException) -> None:
    """Print ``exc``'s traceback to stderr when ``PLANC_DEBUG=1``: for failures planc turns into a
    message (a plugin's exception), so whoever must fix the code can still see where it failed."""
    if os.environ.get(DEBUG_ENV) == "1":
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)


class DataError(ValueError):
    """The training data cannot be used with this plan, found when a run opens or reads it (the
    message says what to change); :mod:`planc.runtime.data` and its token-file source raise it."""


def render_error(
    message: str,
    location: SourceLocation | None,
    hint: str | None,
    source: str | None,
) -> str:
    """Render ``file:line:col: error: message``, the source line, a caret, and the hint."""
    if location is None:
        lines = [f"error: {message}"]
    else:
        lines = [f"{location.file}:{location.line}:{location.col}: error: {message}"]
        quoted = _source_line(source, location.line)
        if quoted is not None:
            gutter = f"{location.line:>5} | "
            width = max(1, (location.end_col or location.col + 1) - location.col)
            # Keep the caret under the right character even when the line has tabs.
            prefix = "".join("\t" if ch == "\t" else " " for ch in quoted[: location.col - 1])
            lines.append(gutter + quoted)
            lines.append(
                " " * (len(gutter) - 2) + "| " + prefix + "^" * min(width, max(1, len(quoted) - location.col + 1))
            )
    if hint:
        lines.append(f"  hint: {hint}")
    return "\n".join(lines)


def _source_line(source: str | None, line: int, max_width: int = 200) -> str | None:
    if source is None or line < 1:
        return None
    all_lines = _lines(source)
    if line > len(all_lines):
        return None
    text = all_lines[line - 1].rstrip("\r")
    # A printable, bounded excerpt: binary junk or a 10 MB single line must not flood the terminal.
    text = "".join(ch if ch.isprintable() or ch == "\t" else "?" for ch in text[:max_width])
    return text


@lru_cache(maxsize=4)
def _lines(source: str) -> list[str]:
    """The lines of ``source``, split once per source however many errors quote it. Lines end at
    "\n" only, as the lexer counts them (str.splitlines also splits at \f, \x1c, \u2028, ...,
    which would quote the wrong line)."""
    return source.split("\n")


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """``"did you mean 'x'?"`` for the closest candidates, or None if none is close.

    In order: the same name in another case (``h100`` -> ``H100``); names that start with the
    word (``H100`` -> ``H100-SXM``, ``A100`` -> both A100 presets); then the closest spelling that
    keeps the word's numbers (``lama3-8b`` -> ``llama3-8b``, but never ``H100`` -> ``H200`` or
    ``llama3.2-1b`` -> ``llama2-13b``: a suggestion that changes a number names another thing).
    """
    matches = close_names(str(word), [str(c) for c in candidates])
    if not matches:
        return None
    return "did you mean " + " or ".join(f"'{m}'" for m in matches) + "?"


def close_names(word: str, candidates: list[str], limit: int = 3) -> list[str]:
    """The candidates :func:`did_you_mean` suggests for ``word`` (best first, at most ``limit``)."""
    key = word.lower()
    same = [c for c in candidates if c.lower() == key]
    if same:
        return same[:limit]
    if len(key) >= 3:
        longer = [c for c in candidates if c.lower().startswith(key)]
        if longer:
            return sorted(longer, key=len)[:limit]
    numbers = _numbers(word)
    lowered = {c.lower(): c for c in candidates}
    close = difflib.get_close_matches(key, list(lowered), n=len(lowered), cutoff=0.6)
    return [lowered[c] for c in close if _numbers(c) == numbers][:1]


def _numbers(name: str) -> list[str]:
    return re.findall(r"\d+", name)


def one_of(candidates: Iterable[str]) -> str:
    """``"one of: a, b, c"`` — for hints that list the valid choices."""
    return "one of: " + ", ".join(str(c) for c in candidates)
