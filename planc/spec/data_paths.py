"""The plan's data paths (``train.data``, ``train.val_data``), checked when the plan is read.

Paths stay as written (docs/data.md, "Paths on many nodes"); a relative one resolves against the
.plan file's directory, which the plan records as its ``data_root`` (so does a relative
``model.weights``, docs/weights.md). The files' contents (token
ids against the vocabulary, sizes) are checked by :mod:`planc.data.check` once the plan is valid.
"""

from __future__ import annotations

from pathlib import Path as FsPath

from planc.spec.issues import SpecError, SpecIssue
from planc.spec.model import ModelSpec
from planc.spec.plan import Plan

#: Keys that only mean something with validation data.
_EVAL_KEYS = ("eval_every", "eval_batches")


def check_data_paths(values: dict, base_dir: FsPath, issues: list[SpecIssue]) -> str | None:
    """Check that the data files exist (relative to the .plan file); paths stay as written. Returns the
    data root (the plan's directory, absolute) when a file is named by a relative path, else None."""
    for key in _EVAL_KEYS:
        if key in values and values.get("val_data") is None:
            issues.append(
                SpecIssue(
                    ("train", key),
                    f"{key} is set, but there is no val_data to evaluate on",
                    'add val_data = "..." (planc prepare writes val.bin beside train.bin), or remove ' + key,
                )
            )
    root = None
    for key in ("data", "val_data"):
        data = values.get(key)
        if not isinstance(data, str) or data == "synthetic":
            continue
        path = FsPath(data)
        if not path.is_absolute():
            root = str(base_dir.resolve())
            path = base_dir / path
        problem = _data_path_problem(path, data)
        if problem:
            issues.append(
                SpecIssue(
                    ("train", key),
                    problem,
                    'give a token file (.bin), a text file (paths are relative to the .plan file) or "synthetic"',
                )
            )
    return root


def _data_path_problem(path: FsPath, written: str) -> str | None:
    try:
        if path.is_file():
            return None
        from planc.data.token_files import megatron_prefix

        if megatron_prefix(path) is not None:
            return None
    except (OSError, ValueError) as exc:  # a NUL byte, a name too long for the file system
        return f"cannot use {written!r} as a data path: {exc}"
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.bin"))[:3]
        return f"{path} is a directory; name a file in it" + (f" (it has {', '.join(found)})" if found else "")
    return f"data file not found: {path}"


def check_data_files(plan: Plan) -> Plan:
    """The data files' vocabulary and size against the model (only when the plan names a file)."""
    if not any(data not in (None, "synthetic") for data in (plan.train.data, plan.train.val_data)):
        return plan
    from planc.data.check import check_data_files as check_contents

    issues, notes = check_contents(plan)
    if issues:
        raise SpecError(issues)
    return plan.model_copy(update={"notes": plan.notes + tuple(notes)}) if notes else plan


def weights_root(model: ModelSpec | None, base_dir: FsPath) -> str | None:
    """The plan's directory (absolute) when ``init = pretrained`` names its weights by a relative
    path: the data root they resolve against, as relative data paths do."""
    if model is None or model.weights is None or FsPath(model.weights).is_absolute():
        return None
    return str(base_dir.resolve())
