"""Where verify results are kept, so that ``planc explain`` can show them beside its prediction.

``planc verify`` writes ``verify.json`` into the run directory and a copy into a results folder
keyed by the plan's content and chosen layout (:func:`plan_key`): ``$PLANC_VERIFY_DIR`` when
set, else ``~/.cache/planc/verify``. ``explain`` looks up the same key; a changed plan (any key
of model, hardware, train or layout) has another key, so a stale measurement is never shown.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from collections.abc import Iterable
from dataclasses import MISSING, fields
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from planc.fileio import write_text_atomically
from planc.spec import Layout, Plan

if TYPE_CHECKING:
    from planc.strategies.registry import Registry

_IGNORED = ("source", "notes", "data_root")


def plan_key(plan: Plan, layout: Layout) -> str:
    """SHA-256 (first 16 hex digits) of the plan's content (not where it was read from) and the layout."""
    data = plan.model_dump(mode="json", exclude_computed_fields=True)
    for name in _IGNORED:
        data.pop(name, None)
    text = json.dumps({"plan": data, "layout": layout.model_dump(mode="json")}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: planc's modules whose code makes a prediction (relative to the package): the cost model, the
#: strategies' cost passes, where stages sit and when zero-bubble's gradients live, the topology,
#: the device presets, and the rows verify predicts. A result keeps their digest
#: (:func:`cost_model_fingerprint`): the key holds the plan, not the model that priced it.
PREDICTING_MODULES = (
    "cost/*.py",
    "strategies/*/cost_pass.py",
    "stages.py",
    "zero_bubble.py",
    "hardware/*.py",
    "spec/presets/*.py",
    "verify/predicted.py",
)


@lru_cache(maxsize=1)
def _own_digest() -> bytes:
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for pattern in PREDICTING_MODULES:
        for path in sorted(root.glob(pattern)):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.digest()


def cost_model_fingerprint(plugin_sources: Iterable[Path] = ()) -> str:
    """SHA-256 (first 16 hex digits) of the source of :data:`PREDICTING_MODULES` and of the plugins'
    cost-pass modules that priced the plan (:func:`plugin_cost_sources`): equal for two results
    exactly when the same code predicted them (a new planc or plugin, or an edit of either)."""
    digest = hashlib.sha256(_own_digest())
    for path in sorted({Path(p) for p in plugin_sources}):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def plugin_cost_sources(plan: Plan, layout: Layout, registry: Registry) -> tuple[Path, ...]:
    """The source files of the third-party strategies active in ``layout`` (outside planc): their
    cost passes predict too, and a new version of a plugin prices differently. A plugin that is a
    package gives all its modules (PowerSGD's cost pass reads ``compression.py`` beside it)."""
    own = Path(__file__).resolve().parent.parent
    found: set[Path] = set()
    for step in registry.passes(plan, layout).steps:
        module = getattr(getattr(step.cost, "__self__", None), "module", None)  # a LoadedStrategy's
        source = getattr(module, "__file__", None) or _source_file(step.cost)
        path = Path(source).resolve() if source else None
        if path is None or path.is_relative_to(own):
            continue
        package = getattr(module, "__package__", None)
        found.update(path.parent.glob("*.py") if package else (path,))
    return tuple(sorted(found))


def _source_file(function: object) -> str | None:
    try:
        return inspect.getsourcefile(function)  # type: ignore[arg-type]
    except TypeError:  # a callable object or a builtin: no file of its own to read
        return None


def predicted_by_another_model(result: dict, fingerprint: str | None = None) -> bool:
    """Whether ``result``'s predicted column came from other cost-model code than this planc's
    (or from a planc that did not record it). ``fingerprint``: this planc's for the result's plan
    (with its plugins' cost passes); planc's own code alone when not given."""
    return result.get("cost_model") != (fingerprint or cost_model_fingerprint())


def results_dir() -> Path:
    configured = os.environ.get("PLANC_VERIFY_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "planc" / "verify"


#: File names of the two kinds of result: a run of the program, a simulation (``--simulate``).
KINDS = {"verify": "verify", "simulate": "simulate"}


def save(result: dict, run_dir: Path, kind: str = "verify") -> Path:
    """Write ``result`` to ``run_dir/<kind>.json`` and to the results folder; returns the latter."""
    text = json.dumps(result, indent=1) + "\n"
    write_text_atomically(run_dir / f"{KINDS[kind]}.json", text)
    path = results_dir() / _file_name(result["key"], kind)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, text)
    except OSError:  # a read-only home: the run directory still has it
        return run_dir / f"{KINDS[kind]}.json"
    return path


def _file_name(key: str, kind: str) -> str:
    return f"{key}.json" if kind == "verify" else f"{key}-{KINDS[kind]}.json"


def source_of(plan_path: Path) -> str:
    """How a result names the file it measured (``plan_source``): resolved, so that explain run from
    another directory finds it."""
    return str(Path(plan_path).resolve())


def earlier_version(plan_path: Path, kind: str = "verify") -> Path | None:
    """The newest stored result of ``kind`` that measured the file at ``plan_path``, whatever its key.

    Asked when :func:`load` found none for the plan as it is now: one here was measured before the
    file (or the layout planc chooses for it) changed, which explain says rather than dropping the
    table without a word."""
    source, found = source_of(plan_path), []
    for path in results_dir().glob("*.json"):
        if path.name.endswith("-simulate.json") != (kind == "simulate"):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            if json.dumps(source) in text and json.loads(text).get("plan_source") == source:
                found.append((path.stat().st_mtime, path))
        except (OSError, ValueError, AttributeError):  # unreadable, or JSON that is not an object
            continue
    return max(found)[1] if found else None


class UnreadableResult(ValueError):
    """A stored result this planc cannot show: damaged, or written by a planc whose rows differ."""


def load(plan: Plan, layout: Layout, kind: str = "verify") -> dict | None:
    """The newest result of ``kind`` ("verify" or "simulate") for this plan and layout, or None.

    Raises :class:`UnreadableResult` for a file under the key that is not such a result: the key holds
    the plan, not planc's version, so another version's rows can sit there, and explain must say so
    rather than fail on them."""
    path = results_dir() / _file_name(plan_key(plan, layout), kind)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    try:
        found = json.loads(text)
    except ValueError as exc:
        raise UnreadableResult(f"{path} is not valid JSON ({exc})") from None
    problem = _rows_problem(found)
    if problem:
        raise UnreadableResult(f"{path}: {problem}")
    return found


def _rows_problem(found: object) -> str | None:
    """What keeps ``found``'s rows from being :class:`planc.verify.report.Row`s, or None."""
    from planc.verify.report import Row

    if not isinstance(found, dict) or not isinstance(found.get("rows"), list):
        return "not a result of planc verify (no list of rows)"
    known = {f.name for f in fields(Row)} | {"error"}
    required = {f.name for f in fields(Row) if f.default is MISSING}
    for row in found["rows"]:
        if not isinstance(row, dict):
            return "a row is not an object"
        unknown, missing = sorted(set(row) - known), sorted(required - set(row))
        if unknown or missing:
            parts = [f"unknown field(s) {', '.join(unknown)}"] if unknown else []
            parts += [f"missing field(s) {', '.join(missing)}"] if missing else []
            return f"its rows are not this planc's ({'; '.join(parts)})"
    return None
