"""The tables of ``docs/language.md``, generated from the code so they cannot drift from it.

Every key of every block (type, default, meaning — from the pydantic fields and their
docstrings), the unit table, and the model and device presets. The generated parts of the
markdown sit between ``<!-- generated:NAME -->`` and ``<!-- /generated:NAME -->``;
``python tools/language_tables.py docs/language.md`` rewrites them, and a test checks that the
committed file is up to date.
"""

from __future__ import annotations

import re
import sys
import typing
from pathlib import Path

import annotated_types
from pydantic_core import PydanticUndefined

from planc.spec import BLOCKS, PluginUse, block_keys
from planc.spec.fields import unit_kind_of
from planc.spec.preset_tables import device_preset_table, model_preset_table
from planc.spec.presets import HARDWARE_PRESETS
from planc.units import UNITS

_KIND_TYPES = {
    "bytes": "size, e.g. `80 GiB`",
    "bandwidth": "bandwidth, e.g. `300 GB/s`",
    "compute": "FLOP/s, e.g. `312 TFLOPS`",
    "time": "time, e.g. `5 us`",
}

#: Defaults computed by validators (not pydantic defaults), as the validators compute them.
_DERIVED_DEFAULTS = {
    ("model", "kv_heads"): "= heads",
    ("model", "ffn"): "4·hidden (gelu); ⌈8·hidden/3⌉₂₅₆ (swiglu)",
    ("model", "bias"): "true for gelu, false for swiglu",
    ("hardware", "per_node"): "device preset, else 8",
    ("hardware", "hbm_bw"): "device preset, else 2000 GB/s",
    ("hardware", "peak_fp32"): "device preset, else peak / 16",
    ("hardware", "intra_node_latency"): "device preset, else 5 us",
    ("hardware", "inter_node_latency"): "device preset, else 10 us",
    ("hardware", "efficiency"): "device preset, else 0.7",
    ("hardware", "intra_node_link_efficiency"): "device preset, else 0.8; 1 with a profile's measured link",
    ("hardware", "inter_node_link_efficiency"): "device preset, else 0.96; 1 with a profile's measured link",
    ("hardware", "nvls_all_reduce_bw"): "device preset's over its own NVLink (H100, H200), else none",
    ("hardware", "inter_node_bw"): "device preset, or inter_node_bw_per_node / per_node",
    ("hardware", "inter_node_bw_per_node"): "none",
    ("hardware", "intra_node_link"): (
        'device preset\'s (if intra_node_bw is its own), "PCIe" if the device\'s name says so, else "intra-node"'
    ),
    ("train", "log"): "none (metrics.jsonl only)",
    ("train", "val_data"): "none",
}
_SOURCE_KEYS = {
    "preset": ("string", "—", "A model preset to start from (see *Model presets*); keys written after it override it."),
    "from": (
        "string",
        "—",
        "A Hugging Face `config.json` to read the architecture from, relative to the "
        '.plan file (usually written `model from "..."`).',
    ),
}


def _type_text(annotation) -> str:
    """``Union[Annotated[int, Gt(0)], Literal['auto']]`` -> ``int > 0 or auto``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(annotation)
        return _type_text(base) + _bounds_text(meta)
    if origin is typing.Union or origin is getattr(__import__("types"), "UnionType", None):
        parts = [_type_text(arg) for arg in typing.get_args(annotation) if arg is not type(None)]
        return " or ".join(parts)
    if origin is typing.Literal:
        return " \\| ".join(str(value) for value in typing.get_args(annotation))
    if origin is tuple:  # tuple[str, ...]: the language writes a list (one value alone is a list of one)
        return f"{_type_text(typing.get_args(annotation)[0])} or list of them"
    return {int: "int", float: "number", str: "string", bool: "true/false"}.get(annotation, str(annotation))


def _bounds_text(metadata) -> str:
    """`` > 0``, `` ≥ 0``, or an interval `` in [0, 1)`` from pydantic's constraint metadata."""
    lower = upper = None
    stack = list(metadata)
    while stack:
        item = stack.pop()
        if isinstance(item, annotated_types.Gt):
            lower = ("(", item.gt)
        elif isinstance(item, annotated_types.Ge):
            lower = ("[", item.ge)
        elif isinstance(item, annotated_types.Lt):
            upper = (")", item.lt)
        elif isinstance(item, annotated_types.Le):
            upper = ("]", item.le)
        elif hasattr(item, "metadata"):  # a FieldInfo inside Annotated[...]
            stack.extend(item.metadata)
    if lower and upper:
        return f" in {lower[0]}{lower[1]}, {upper[1]}{upper[0]}"
    if lower:
        return f" {'>' if lower[0] == '(' else '≥'} {lower[1]}"
    if upper:
        return f" {'<' if upper[0] == ')' else '≤'} {upper[1]}"
    return ""


def _field_type(field) -> str:
    kind = unit_kind_of(field)
    if kind:
        return _KIND_TYPES[kind]
    return _type_text(field.annotation) + _bounds_text(field.metadata)


def _default_text(block: str, name: str, field) -> str:
    if (block, name) in _DERIVED_DEFAULTS:
        return _DERIVED_DEFAULTS[(block, name)]
    if block == "hardware" and any(name in preset for preset in HARDWARE_PRESETS.values()):
        return "device preset"
    if field.default is not PydanticUndefined:
        value = field.default
        if isinstance(value, bool):
            return "true" if value else "false"
        return "—" if value is None else f"`{value}`" if not isinstance(value, str) else f"`{value}`"
    if field.default_factory is not None:
        return "empty"
    if block == "model":
        return "**required** (or preset/from)"
    return "**required**"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|") if "\\|" not in text else " ".join(text.split())


def key_table(block: str) -> str:
    """The markdown table of every key ``block`` accepts."""
    fields = BLOCKS[block].model_fields
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for name in block_keys(block):
        if name in fields:
            field = fields[name]
            kind, default, meaning = _field_type(field), _default_text(block, name, field), field.description or ""
        else:
            kind, default, meaning = _SOURCE_KEYS[name]
        rows.append(f"| `{name}` | {_cell(kind)} | {_cell(default)} | {_cell(meaning)} |")
    return "\n".join(rows)


def use_table() -> str:
    fields = PluginUse.model_fields
    return "\n".join(
        ["| part | meaning |", "|---|---|"]
        + [f"| `{name}` | {_cell(fields[name].description or '')} |" for name in fields if not fields[name].exclude]
    )  # bookkeeping the user never writes


def _unit_size(unit: str, kind: str, scale: float) -> str:
    """``GiB -> 2^30 bytes``, ``Gb/s -> 10^9 bits/s = 1.25·10^8 bytes/s``, ``min -> 60 s``."""
    base = {"bytes": "bytes", "bandwidth": "bytes/s", "compute": "FLOP/s", "time": "s"}[kind]
    if kind == "time":
        return f"{scale:g} s"
    for power in range(6):
        if scale == 1000.0**power:
            return f"10^{3 * power} {base}" if power else f"1 {base.replace('bytes', 'byte')}"
        if scale == 1024.0**power and power:
            return f"2^{10 * power} {base}"
        if scale * 8 == 1000.0**power:
            return f"10^{3 * power} bits/s = {scale:.3g} bytes/s"
    return f"{scale:g} {base}"  # pragma: no cover - every unit is one of the above


def unit_table() -> str:
    rows = ["| unit | measures | one unit is |", "|---|---|---|"]
    for unit, (kind, scale) in UNITS.items():
        rows.append(f"| `{unit}` | {kind} | {_unit_size(unit, kind, scale)} |")
    return "\n".join(rows)


def tables() -> dict[str, str]:
    """Generated section name -> its markdown."""
    out = {f"keys:{block}": key_table(block) for block in BLOCKS}
    out.update(
        {
            "keys:use": use_table(),
            "units": unit_table(),
            "presets:models": model_preset_table(),
            "presets:devices": device_preset_table(),
        }
    )
    return out


_SECTION = re.compile(r"(<!-- generated:(?P<name>[\w:]+) -->\n).*?(<!-- /generated:(?P=name) -->)", re.DOTALL)


def update(markdown: str) -> str:
    """``markdown`` with every generated section replaced by its current content."""
    generated = tables()
    missing = set(generated) - set(m.group("name") for m in _SECTION.finditer(markdown))
    if missing:
        raise ValueError(f"docs/language.md has no generated section for: {', '.join(sorted(missing))}")
    return _SECTION.sub(lambda m: m.group(1) + generated[m.group("name")] + "\n" + m.group(3), markdown)


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/language.md")
    target.write_text(update(target.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"updated {target}")
