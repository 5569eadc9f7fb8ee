"""Hints about where a model's architecture should come from: a preset's name, misspelt or written in
the wrong place, gets the preset meant; another model of a known family gets that family's presets."""

from __future__ import annotations

import re

from planc.errors import did_you_mean, one_of
from planc.spec.issues import SpecIssue
from planc.spec.presets import MODEL_PRESETS

#: The keys that describe an architecture: a model block with none of them and no source has none.
_ARCHITECTURE_KEYS = ("layers", "hidden", "heads", "vocab")


def label_meant_as_preset(values: dict, issues: list[SpecIssue]) -> bool:
    """``model "llama3-8b" { }``: the quoted label is the model's display name, not a preset, so the
    block has no architecture and would get four "missing key" errors. When the label is a preset's
    name (or one misspelt) and no architecture key is written, say what was meant, once."""
    label = values.get("name")
    if not isinstance(label, str) or any(key in values for key in _ARCHITECTURE_KEYS):
        return False
    if label in MODEL_PRESETS:
        hint = f'write model {{ preset = "{label}" }}: the quoted label after model only names the model'
    elif close := did_you_mean(label, MODEL_PRESETS):
        hint = (
            f"{close} A preset is loaded with model {{ preset = ... }}; "
            "the quoted label after model only names the model"
        )
    else:
        return False
    issues.append(SpecIssue(("model", "name"), f"the model block names {label!r} but loads no preset", hint))
    return True


def model_preset_hint(name: str) -> str:
    """A typo gets the preset it misspells; another model of a known family (``llama3.2-1b``) gets
    that family's presets, never a different-sized model by spelling alone."""
    close = did_you_mean(name, MODEL_PRESETS)
    if close:
        return close
    found = re.match(r"[a-z]+\d*", name.lower())
    family = [p for p in MODEL_PRESETS if found and re.match(re.escape(found.group()) + r"(\W|$)", p)]
    how = 'or describe the model with its keys (layers, hidden, heads, ...) or from "config.json"'
    if family:
        return f"planc's {found.group() if found else ''} presets are {', '.join(family)}; {how}"
    return f"{one_of(MODEL_PRESETS)}; {how}"
