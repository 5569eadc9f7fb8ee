"""``load_plan(path) -> Plan``: the one way every later stage reads a ``.plan`` file.

Reading is defensive: a missing file, a directory, a device or pipe, an unreadable, binary,
non-UTF-8, empty or oversized file each gives a :class:`~planc.errors.PlanError` that says so —
never a traceback, and never an unbounded read.

The strategy registry is handed in (the command loaded it): the names a ``use`` block may refer
to are the ones installed distributions register (restricted by ``PLANC_PLUGINS``), and a plan
with ``use`` blocks has their options validated by the strategies' ``Options`` models
(plan-time faces only, no torch), so a misspelled option is reported at its line like any other
key.
"""

from __future__ import annotations

import difflib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from planc.dsl.lower import build
from planc.dsl.parser import parse
from planc.errors import PlanError, SourceLocation
from planc.spec.issues import SpecIssue
from planc.spec.plan import Plan

if TYPE_CHECKING:
    from planc.strategies.registry import Registry

#: A plan is a few dozen lines; anything this large is not one (and is not read whole).
MAX_PLAN_BYTES = 256 * 1024


def load_plan(path: str | os.PathLike[str], *, strategies: Registry) -> Plan:
    """Read, parse and validate the plan at ``path``; raise PlanError(s) for anything wrong."""
    path = Path(path)
    text = read_plan_text(path)
    return load_plan_text(text, str(path), strategies=strategies, base_dir=path.parent)


def load_plan_text(
    text: str, filename: str = "<plan>", *, strategies: Registry, base_dir: str | os.PathLike[str] | None = None
) -> Plan:
    """Parse and validate plan ``text``; ``filename`` is what error messages show; relative paths
    in the plan (``model from``, ``train.data``) resolve against ``base_dir`` (default: cwd);
    ``use`` blocks are checked against ``strategies``, ``train.log`` against the installed
    metrics sinks."""
    plan_file = parse(text, filename)
    return build(
        plan_file,
        base_dir=Path(base_dir) if base_dir is not None else None,
        known_strategies=strategies.registered,
        check_uses=lambda plan: check_sink_names(plan) + check_use_blocks(plan, strategies),
    )


def check_use_blocks(plan: Plan, strategies: Registry) -> list[SpecIssue]:
    """The ``use`` blocks' options, then whether their strategies accept at least one legal layout."""
    if not plan.uses:
        return []
    issues = strategies.validate_uses(plan)
    if issues:
        return issues
    from planc.planner.refusals import refused_everywhere
    from planc.strategies.contract import PluginError

    try:
        return refused_everywhere(plan, strategies)
    except PluginError as error:  # a named plugin's enabled() or check() raised: point at its use block
        return [SpecIssue(strategies.path_of(plan, error), error.message, error.hint)]


def check_sink_names(plan: Plan) -> list[SpecIssue]:
    """``train.log`` names built-in sinks or installed sink plugins (entry-point names; none is imported)."""
    if not plan.train.log:
        return []
    from planc.errors import did_you_mean, one_of
    from planc.runtime.sinks import known_sink_names

    known = known_sink_names()
    return [
        SpecIssue(
            ("train", "log"),
            f"unknown metrics sink '{name}'",
            (did_you_mean(name, known) or one_of(known)) + " (a sink plugin must be pip-installed)",
        )
        for name in plan.train.log
        if name not in known
    ]


def read_plan_text(path: Path) -> str:
    """The text of a plan file, or a PlanError saying why it cannot be one."""
    shown = str(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise PlanError(f"{shown}: no such file", hint=_not_found_hint(path)) from None
    except OSError as exc:
        raise PlanError(f"cannot read {shown}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise PlanError(
            f"{shown} is a directory, not a .plan file", hint="give the path of a .plan file, e.g. plans/tiny-cpu.plan"
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise PlanError(f"{shown} is not a regular file", hint="give the path of a .plan file") from None
    if info.st_size > MAX_PLAN_BYTES:
        raise PlanError(
            f"{shown} is too large for a plan ({info.st_size:,} bytes; the limit is {MAX_PLAN_BYTES:,})",
            hint="is this the right file? A .plan file is a few dozen lines",
        )
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_PLAN_BYTES + 1)
    except PermissionError:
        raise PlanError(f"cannot read {shown}: permission denied", hint="check the file's permissions") from None
    except OSError as exc:
        raise PlanError(f"cannot read {shown}: {exc.strerror or exc}") from None
    if len(data) > MAX_PLAN_BYTES:  # it grew after stat()
        raise PlanError(f"{shown} is too large for a plan (over {MAX_PLAN_BYTES:,} bytes)")
    return decode_plan_bytes(data, shown)


def decode_plan_bytes(data: bytes, shown: str) -> str:
    """UTF-8 text (a leading byte-order mark is dropped), or a PlanError for binary or empty data."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if not data.strip():
        raise PlanError(
            f"{shown} is empty",
            hint="a plan needs at least a model, a hardware and a train block; see plans/tiny-cpu.plan",
        )
    if b"\x00" in data[:8192]:
        raise PlanError(f"{shown} is not a text file (it contains NUL bytes)", hint="is this the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        readable = data.decode("utf-8", errors="replace")
        before = data[: exc.start].decode("utf-8", errors="replace")
        line = before.count("\n") + 1
        column = len(before) - (before.rfind("\n") + 1) + 1
        raise PlanError(
            f"the file is not valid UTF-8 text (byte 0x{data[exc.start]:02x} here)",
            location=SourceLocation(shown, line, column),
            source=readable,
            hint="save the file as UTF-8 text",
        ) from None


def _not_found_hint(path: Path) -> str | None:
    if path.suffix != ".plan" and path.with_suffix(".plan").is_file():
        return f"did you mean {path.with_suffix('.plan')}?"
    parent = path.parent if str(path.parent) else Path(".")
    try:
        plans = sorted(p.name for p in parent.iterdir() if p.suffix == ".plan")[:200] if parent.is_dir() else []
    except OSError:
        plans = []
    close = difflib.get_close_matches(path.name, plans, n=1, cutoff=0.6)
    return f"did you mean {parent / close[0]}?" if close else None
