"""``init = pretrained`` in a plan: where the weights are, and whether they fit the model (no torch).

``planc check`` answers before any process starts: the directory must hold a Hugging Face
``config.json`` of a family planc reads, nothing in that config may make planc's model compute
something else (:func:`planc.weights.hf_configs.differences`), and the safetensors headers must
hold every tensor the model needs, in the shape it needs, and no weight it would silently drop.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planc.spec.issues import SpecIssue
from planc.weights.hf_names import (
    BASE_PREFIX,
    IGNORED_SUFFIXES,
    MODEL_TYPE_FAMILY,
    Family,
    hf_shapes,
    tensor_sources,
)
from planc.weights.safetensors_index import TensorInfo, WeightsError, read_directory

if TYPE_CHECKING:
    from planc.spec.model import ModelSpec
    from planc.spec.plan import Plan

WHERE = ("model", "init")
WEIGHTS_HINT = "point model from (or weights = ...) at a Hugging Face model directory: config.json + model.safetensors"


def resolve_weights(values: dict[str, Any], config_dir: str | None, issues: list[SpecIssue]) -> dict:
    """Fill ``weights`` for ``init = pretrained``: the key, else the ``from`` directory -- as written,
    like the data paths: a relative one resolves against the plan's ``data_root`` (the .plan file's
    directory) or, at run time, the program's ``--data-root`` (:func:`weights_directory`)."""
    init, weights = values.get("init"), values.get("weights")
    if weights is not None and not isinstance(weights, str):
        issues.append(SpecIssue(("model", "weights"), 'weights must be a quoted path, e.g. weights = "hf/my-llama"'))
        return {k: v for k, v in values.items() if k != "weights"}
    if init != "pretrained":
        if weights is not None:
            issues.append(
                SpecIssue(
                    ("model", "weights"),
                    "weights are read only with init = pretrained",
                    "add init = pretrained to start from them, or remove weights",
                )
            )
        return values
    if weights is not None:
        return values
    if config_dir is None:
        issues.append(SpecIssue(WHERE, "init = pretrained needs the weights' directory", WEIGHTS_HINT))
        return values
    return {**values, "weights": config_dir}


def weights_directory(spec: ModelSpec, root: str | Path | None) -> Path:
    """Where ``spec.weights`` is on this machine: an absolute path as written, a relative one under
    ``root`` (the plan's ``data_root``, or the program's ``--data-root``)."""
    path = Path(spec.weights or "")
    return path if path.is_absolute() or root is None else Path(root) / path


def check_pretrained_weights(plan: Plan) -> Iterable[SpecIssue]:
    """The ``init = pretrained`` checks (a pass of :data:`planc.spec.checks.CHECKS`)."""
    spec = plan.model
    if spec.init != "pretrained" or spec.weights is None:
        return []
    try:
        directory = weights_directory(spec, plan.data_root)
        return [SpecIssue(WHERE, problem, hint) for problem, hint in weight_problems(spec, directory)]
    except WeightsError as exc:
        return [SpecIssue(WHERE, str(exc), WEIGHTS_HINT)]


def weight_problems(spec: ModelSpec, directory: Path) -> list[tuple[str, str]]:
    """(message, hint) for everything that keeps ``directory``'s weights from being ``spec``'s, exactly."""
    from planc.spec.hf_config import HFConfigError, load_config_json
    from planc.weights.hf_configs import differences

    try:
        config = load_config_json(directory / "config.json")
    except HFConfigError as exc:
        raise WeightsError(str(exc)) from None
    family = MODEL_TYPE_FAMILY.get(str(config.get("model_type")))
    problems = [
        (f"{directory / 'config.json'}: {d}", "planc starts only from weights whose model it builds exactly")
        for d in differences(config, spec)
    ]
    if family is None or problems:
        return problems
    stored = read_directory(directory)
    return [
        (message, "the plan's model keys must match the weights' config.json")
        for message in tensor_problems(spec, family, stored, directory)
    ]


def resolve_names(stored: dict[str, Any], family: Family) -> dict[str, str]:
    """Expected name -> stored name: checkpoints saved from the base model lack the prefix (GPT-2's
    original ``h.0.attn.c_attn.weight`` for ``transformer.h.0.attn.c_attn.weight``)."""
    prefix = BASE_PREFIX[family]
    resolved = {name: name for name in stored}
    for name in stored:
        if not name.startswith(prefix) and not name.startswith(("lm_head.", "embed_out.")):
            resolved.setdefault(prefix + name, name)
    return resolved


def tensor_problems(spec: ModelSpec, family: Family, stored: dict[str, TensorInfo], directory: Path) -> list[str]:
    """Missing tensors, wrong shapes, and stored weights planc's model would leave out."""
    names = resolve_names(stored, family)
    expected = hf_shapes(spec, family)
    needed = {source.hf_name for source in tensor_sources(spec, family).values()}
    problems = []
    for name in sorted(needed):
        if name not in names:
            problems.append(f"{directory} has no tensor {name!r}")
            continue
        shape, want = stored[names[name]].shape, expected[name]
        # a learned position table may be longer than seq_len: planc takes its first seq_len rows
        longer_positions = name.endswith("wpe.weight") and shape[1:] == want[1:] and shape[0] >= want[0]
        if shape != want and not longer_positions:
            problems.append(f"{name} has shape {list(shape)} in {directory}, the model needs {list(want)}")
    used = {names[n] for n in needed if n in names}
    tied_output = {"lm_head.weight", "embed_out.weight"} if spec.tie_embeddings else set()
    unused = sorted(n for n in stored if n not in used and n not in tied_output and not n.endswith(IGNORED_SUFFIXES))
    if unused:
        problems.append(
            f"{directory} holds {len(unused)} tensor(s) planc's model has no place for, e.g. {unused[0]!r} "
            f"(layers = {spec.layers}: a model with fewer layers or without biases would drop them)"
        )
    return problems[:8]
