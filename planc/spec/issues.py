"""Validation problems found in a plan, addressed by key path rather than by file position.

The spec layer knows *which key* is wrong (``("layout", "tp")``); the DSL layer, which kept the
source positions, turns each :class:`SpecIssue` into a located :class:`~planc.errors.PlanError`.
"""

from __future__ import annotations

from dataclasses import dataclass

Path = tuple  # of str | int: ("layout", "tp"), ("uses", 0, "name")


@dataclass(frozen=True)
class SpecIssue:
    """One problem: where (key path), what is wrong, and what to do about it."""

    path: Path
    message: str
    hint: str | None = None
    related: tuple[Path, ...] = ()
    """Other keys the problem is about: when ``path`` was filled by a preset the user did not
    write, the issue points at the first of these the user did write (``hidden = 4095`` beside
    a preset's heads), not at the preset."""


class SpecError(Exception):
    """One or more :class:`SpecIssue` found while building a ``Plan``."""

    def __init__(self, issues: list[SpecIssue]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, i.path))}: {i.message}" for i in issues))
        self.issues = list(issues)
