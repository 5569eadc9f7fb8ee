"""Build a validated :class:`Plan` from the plain data a ``.plan`` file holds.

``raw`` is what the DSL layer hands over — plain dicts of plain values, unit literals as
:class:`~planc.units.Quantity`, and the keyword ``auto`` as the string ``"auto"``::

    {"model": {"preset": "llama3-8b", "seq_len": 4096},      # or {"from": "config.json"}, or keys
     "hardware": {"device": "H100-SXM", "nodes": 8},
     "train": {"global_batch": 512},
     "layout": {"tp": 8},                                      # optional
     "checkpoint": {"every": 100},                             # optional
     "uses": [{"name": "powersgd", "options": {"rank": 4}}]}   # optional

It runs a fixed sequence of passes — block names, unit kinds, model source (preset or config
file), field validation, cross-field checks — and collects every problem as a
:class:`SpecIssue` addressed by key path, so the caller can point at the source.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from pathlib import Path as FsPath
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from planc.errors import did_you_mean, one_of
from planc.spec.checkpoint import CheckpointSpec
from planc.spec.checks import run_checks
from planc.spec.data_paths import check_data_files, check_data_paths, weights_root
from planc.spec.fields import unit_kind_of
from planc.spec.hardware import CUSTOM_DEVICE_REQUIRED, HardwareSpec
from planc.spec.hardware_profile import profile_defaults, with_process_count_note, written_hardware_keys
from planc.spec.hf_config import HFConfigError, read_hf_config
from planc.spec.invalid import describe_invalid, invalid_hint
from planc.spec.issues import SpecError, SpecIssue
from planc.spec.layout import LayoutSpec
from planc.spec.misplaced import explained_elsewhere, unknown_key_hint
from planc.spec.model import ModelSpec
from planc.spec.model_hints import label_meant_as_preset, model_preset_hint
from planc.spec.plan import Plan, PluginUse
from planc.spec.presets import HARDWARE_PRESETS, MODEL_PRESETS
from planc.spec.train import TrainSpec
from planc.units import KIND_DESCRIPTIONS, Quantity, is_bare_number
from planc.weights.plan_checks import resolve_weights

#: Block name -> the section model that validates it.
BLOCKS: dict[str, type[BaseModel]] = {
    "model": ModelSpec,
    "hardware": HardwareSpec,
    "train": TrainSpec,
    "layout": LayoutSpec,
    "checkpoint": CheckpointSpec,
}
REQUIRED_BLOCKS = ("model", "hardware", "train")
#: Keys of the model block that say where the architecture comes from, not what it is.
MODEL_SOURCE_KEYS = ("from", "preset")
#: Computed fields: reported, never written.
DERIVED_KEYS = {
    "model": {"head_dim", "padded_vocab", "params", "params_per_layer", "params_embedding"},
    "hardware": {"world_size", "measured"},
}


def _all_keys() -> dict[str, list[str]]:
    return {block: block_keys(block) for block in BLOCKS}


def block_keys(block: str) -> list[str]:
    """Every key a block accepts (what the language reference documents)."""
    keys = [k for k in BLOCKS[block].model_fields if k not in DERIVED_KEYS.get(block, ())]
    return keys + list(MODEL_SOURCE_KEYS) if block == "model" else keys


def build_plan(
    raw: dict[str, Any],
    *,
    source: str | None = None,
    base_dir: FsPath | None = None,
    known_strategies: Collection[str] | None = None,
) -> Plan:
    """Validate ``raw`` into a Plan, or raise :class:`SpecError` listing every problem found.

    ``base_dir`` resolves relative paths (``model from``, ``train.data``); ``known_strategies``
    (when given) are the names ``use`` may refer to.
    """
    base_dir = base_dir or FsPath.cwd()
    issues = _block_names(raw)
    notes: list[str] = []
    aliases: dict[tuple, tuple] = {}
    sections: dict[str, Any] = {}
    data_root: str | None = None
    for block, model_cls in BLOCKS.items():
        if block not in raw:
            continue
        values: dict[str, Any] | None = dict(raw[block])
        if block == "model":
            values = _resolve_model_source(dict(raw[block]), base_dir, issues, notes, aliases)
        elif block == "train":
            data_root = check_data_paths(dict(raw[block]), base_dir, issues)
        defaults = profile_defaults(values, base_dir, issues, notes) if block == "hardware" and values else {}
        section = _build_section(block, model_cls, values, issues, defaults) if values is not None else None
        if section is not None:
            sections[block] = section

    uses = _build_uses(raw.get("uses", []), known_strategies, issues)
    issues = explained_elsewhere(raw, issues, _all_keys())

    if issues:
        raise SpecError(_apply_aliases(issues, aliases))
    data_root = data_root or weights_root(sections.get("model"), base_dir)
    plan = Plan(**sections, uses=tuple(uses), source=source, notes=tuple(notes), data_root=data_root)
    check_issues = run_checks(plan)
    if check_issues:
        raise SpecError(_apply_aliases(check_issues, aliases))
    return with_process_count_note(check_data_files(plan), base_dir)


def _block_names(raw: dict[str, Any]) -> list[SpecIssue]:
    """Unknown blocks, and required blocks that are missing."""
    issues = [
        SpecIssue(
            (block,), f"unknown block '{block}'", did_you_mean(block, [*BLOCKS, "use"]) or one_of([*BLOCKS, "use"])
        )
        for block in raw
        if block not in BLOCKS and block != "uses"
    ]
    issues += [
        SpecIssue((), f"the plan has no {block} block", _MISSING_BLOCK_HINTS[block])
        for block in REQUIRED_BLOCKS
        if block not in raw
    ]
    return issues


def _build_section(
    block: str, model_cls: type[BaseModel], values: dict[str, Any], issues: list[SpecIssue], defaults: dict
) -> BaseModel | None:
    """Validate one block; its problems are added to ``issues`` (None when it has any). ``defaults``
    (a hardware profile's values) fill keys the block leaves out, after its written keys are checked."""
    block_issues = _check_keys_and_units(block, values, model_cls)
    values = {**defaults, **values}
    if block == "hardware":
        block_issues += _check_device(values)
    issues += block_issues
    # Validate the rest of the block too, so one run reports every mistake.
    bad_keys = {i.path[1] for i in block_issues if len(i.path) == 2}
    values = {k: v for k, v in values.items() if k not in bad_keys}
    if block == "hardware" and "device" in bad_keys:
        return None  # without a known device every preset-filled key would be reported missing
    try:
        section = model_cls.model_validate(values)
    except ValidationError as exc:
        issues += [
            i
            for i in _translate(block, values, model_cls, exc)
            if not _about_dropped(i, bad_keys) and not _follows_from(i, block, block_issues, exc)
        ]
        return None
    return None if block_issues else section


_MISSING_BLOCK_HINTS = {
    "model": 'add a model block, e.g. model { preset = "gpt2" } or model from "config.json"',
    "hardware": 'add a hardware block, e.g. hardware { device = "A100-80GB"  nodes = 1  per_node = 8 }',
    "train": "add a train block with at least global_batch, e.g. train { global_batch = 512 }",
}


def _resolve_model_source(values, base_dir, issues, notes, aliases) -> dict | None:
    """Expand ``preset = ...`` or ``from "config.json"`` into model keys; plan keys override."""
    if "from" in values and "preset" in values:
        issues.append(
            SpecIssue(
                ("model", "preset"),
                "a model block takes either 'from' or 'preset', not both",
                "keep one source of the architecture and override keys after it",
            )
        )
        return None
    for key, example in (("preset", '"llama3-8b"'), ("from", '"config.json"')):
        if key in values and not isinstance(values[key], str):
            issues.append(SpecIssue(("model", key), f"{key} must be a quoted string, e.g. {key} = {example}"))
            return None
    base: dict[str, Any] = {}
    config_dir: str | None = None
    if "preset" in values:
        name = values.pop("preset")
        if name not in MODEL_PRESETS:
            issues.append(
                SpecIssue(
                    ("model", "preset"),
                    f"unknown model preset {name!r}",
                    model_preset_hint(str(name)),
                )
            )
            return None
        base = dict(MODEL_PRESETS[name], name=name)
        origin = ("model", "preset")
    elif "from" in values:
        written = FsPath(values.pop("from"))
        path = written if written.is_absolute() else base_dir / written
        if path.is_dir():  # a Hugging Face model directory
            path, config_dir = path / "config.json", str(written)
        else:
            config_dir = str(written.parent)  # as written, like the data paths
        try:
            base, hf_notes = read_hf_config(path)
        except HFConfigError as exc:
            issues.append(
                SpecIssue(
                    ("model", "from"),
                    str(exc),
                    "give a Hugging Face model directory or its config.json, relative to the .plan file",
                )
            )
            return None
        notes.extend(hf_notes)
        origin = ("model", "from")
    else:
        if label_meant_as_preset(values, issues):
            return None
        return resolve_weights(values, None, issues)
    for key in base:
        if key not in values:
            aliases[("model", key)] = origin
    return resolve_weights({**base, **values}, config_dir, issues)


def _check_keys_and_units(block: str, values: dict, model_cls: type[BaseModel]) -> list[SpecIssue]:
    issues = []
    fields = model_cls.model_fields
    for key, value in values.items():
        if key in DERIVED_KEYS.get(block, ()):
            issues.append(
                SpecIssue(
                    (block, key),
                    f"'{key}' is derived by planc and cannot be set",
                    "remove it; `planc check --json` shows the derived value",
                )
            )
            continue
        if key not in fields:
            issues.append(
                SpecIssue(
                    (block, key), f"unknown key '{key}' in the {block} block", unknown_key_hint(block, key, _all_keys())
                )
            )
            continue
        written = (value.kind, value.text) if isinstance(value, Quantity) else (None, None)
        problem = unit_mismatch(key, unit_kind_of(fields[key]), *written)
        if problem:
            issues.append(SpecIssue((block, key), *problem))
    return issues


def unit_mismatch(
    label: str, expected: str | None, written: str | None, text: str | None, example: str | None = None
) -> tuple[str, str] | None:
    """(message, hint) when a value's unit does not suit its key, else None. ``label`` names the
    key (``memory``, ``option 'bucket' of strategy 'ddp'``); ``expected`` is the key's unit kind
    (None: a plain value); ``written`` the kind of the unit written with ``text`` (None: none);
    ``example`` a value to suggest (a plugin option's default), else one of the kind's."""
    if expected and written is None:
        return (
            f"{label} needs a unit: {KIND_DESCRIPTIONS[expected]}",
            f"write the unit after the number, e.g. {example or _unit_example(expected)}",
        )
    if expected and written is not None and written != expected:
        return (
            f"{label} is {KIND_DESCRIPTIONS[expected].split(',')[0]}, but {text} is "
            f"{KIND_DESCRIPTIONS[written].split(',')[0]}",
            f"use a unit like {example or _unit_example(expected)}",
        )
    if not expected and written is not None:
        return f"{label} takes a plain value, not a quantity ({text})", "drop the unit"
    return None


def _unit_example(kind: str) -> str:
    return {"bytes": "80 GiB", "bandwidth": "300 GB/s", "compute": "312 TFLOPS", "time": "500 ms"}[kind]


def _check_device(values: dict) -> list[SpecIssue]:
    device = values.get("device")
    if device is not None and not isinstance(device, str):
        return [
            SpecIssue(
                ("hardware", "device"),
                "device must be a device name in quotes",
                'e.g. device = "A100-80GB"; ' + one_of(HARDWARE_PRESETS),
            )
        ]
    if not isinstance(device, str) or device in HARDWARE_PRESETS:
        return []
    # The network may be given per node instead (docs/language.md: "give one of the two").
    given = written_hardware_keys(values)
    missing = [k for k in CUSTOM_DEVICE_REQUIRED if k not in given]
    if not missing:
        return []  # a custom device that states its own numbers
    hint = did_you_mean(device, HARDWARE_PRESETS)
    hint = (
        (hint + " " if hint else "use one of " + ", ".join(HARDWARE_PRESETS) + "; ")
        + "or describe a custom device with "
        + ", ".join(missing)
    )
    return [SpecIssue(("hardware", "device"), f"unknown device preset {device!r}", hint)]


def unknown_strategy_hint(name: str, known: Iterable[str]) -> str:
    """What to do about ``use NAME`` when no installed distribution registers NAME: the closest
    name, then where the names are listed."""
    listing = "run `planc plugins` to list installed strategies; a third-party strategy must be pip-installed"
    close = did_you_mean(name, known)
    return f"{close} ({listing})" if close else listing


def _build_uses(raw_uses, known_strategies, issues) -> list[PluginUse]:
    uses = []
    seen: set[str] = set()
    for index, item in enumerate(raw_uses):
        name = item.get("name")
        if known_strategies is not None and name not in known_strategies:
            issues.append(
                SpecIssue(
                    ("uses", index, "name"),
                    f"unknown strategy plugin '{name}'",
                    unknown_strategy_hint(name, known_strategies),
                )
            )
            continue
        if name in seen:
            issues.append(
                SpecIssue(
                    ("uses", index, "name"), f"strategy '{name}' is used twice", "merge the options into one use block"
                )
            )
            continue
        seen.add(name)
        options = {k: _base_units(v) for k, v in item.get("options", {}).items()}
        units: dict[str, tuple[str, str]] = {
            k: (v.kind, v.text or f"{v.value:g}") for k, v in item.get("options", {}).items() if isinstance(v, Quantity)
        }
        unitless = tuple(k for k, v in item.get("options", {}).items() if is_bare_number(v))
        uses.append(PluginUse(name=name, options=options, units=units, unitless=unitless))
    return uses


#: Keys whose default is computed from another key: missing only because that one is. A device
#: preset fills the hardware block's numbers: with no device, only the device is missing; a custom
#: device's peak_fp32 follows from its peak.
_DEFAULT_FROM = {
    ("model", "ffn"): ("hidden", "mlp"),
    ("model", "kv_heads"): ("heads",),
    **{("hardware", key): ("device",) for preset in HARDWARE_PRESETS.values() for key in preset},
    ("hardware", "peak_fp32"): ("device", "peak"),
}


def _follows_from(issue: SpecIssue, block: str, block_issues: list[SpecIssue], exc: ValidationError) -> bool:
    """A "missing key" issue that another issue already explains: the key was misspelled
    ("unknown key 'hiden' - did you mean 'hidden'?"), or its default comes from a key that is
    itself missing or invalid (ffn from hidden and mlp)."""
    if not issue.message.startswith(f"the {block} block is missing '"):
        return False
    key = issue.message.split("'")[1]
    if any(f"did you mean '{key}'?" in (other.hint or "") for other in block_issues):
        return True
    sources = _DEFAULT_FROM.get((block, key), ())
    return any(err["loc"][:1] in [(source,) for source in sources] for err in exc.errors())


def _base_units(value: Any) -> Any:
    """Plugin options get quantities as numbers in base units, in lists too."""
    if isinstance(value, list):
        return [_base_units(item) for item in value]
    return value.value if isinstance(value, Quantity) else value


def _about_dropped(issue: SpecIssue, dropped: set) -> bool:
    return any(f"'{key}'" in issue.message for key in dropped) and "missing" in issue.message


def _translate(block: str, values: dict, model_cls: type[BaseModel], exc: ValidationError) -> list[SpecIssue]:
    """Turn pydantic's errors into one readable issue per offending key."""
    by_key: dict[str, list[ErrorDetails]] = {}
    for err in exc.errors():
        key = str(err["loc"][0]) if err["loc"] else ""
        by_key.setdefault(key, []).append(err)
    issues = []
    for key, errors in by_key.items():
        if not key:  # a rule across keys: point at a key it names that the plan wrote (the most
            # specific: "per device" in a message is not the device key)
            message = "; ".join(e["msg"].removeprefix("Value error, ") for e in errors)
            mentioned = [str(k) for k in values if re.search(rf"\b{re.escape(str(k))}\b", message)]
            named = max(mentioned, key=len, default=None)
            issues.append(SpecIssue((block, named) if named else (block,), message))
            continue
        field = model_cls.model_fields.get(key)
        if any(e["type"] == "missing" for e in errors):
            doc = (field.description or "") if field else ""
            issues.append(
                SpecIssue(
                    (block,),
                    f"the {block} block is missing '{key}'",
                    f"add {key} = ...  ({doc.splitlines()[0] if doc else 'required'})",
                )
            )
            continue
        value = values.get(key)
        issues.append(SpecIssue((block, key), describe_invalid(key, value, errors, field), invalid_hint(value, errors)))
    return issues


def _apply_aliases(issues: list[SpecIssue], aliases: dict[tuple, tuple]) -> list[SpecIssue]:
    """Point issues about preset-provided keys at a related key the plan writes, else at the
    ``preset``/``from`` line that brought them."""
    return [SpecIssue(_written_path(i, aliases), i.message, i.hint) for i in issues]


def _written_path(issue: SpecIssue, aliases: dict[tuple, tuple]) -> tuple:
    if issue.path not in aliases:
        return issue.path
    return next((r for r in issue.related if r not in aliases), aliases[issue.path])
