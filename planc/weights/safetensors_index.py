"""The tensors of a Hugging Face model directory, from its safetensors headers alone (no torch).

A safetensors file is an 8-byte little-endian header length, a JSON header naming every tensor's
dtype, shape and byte range, then the raw data (https://github.com/huggingface/safetensors, "Format").
A directory holds either ``model.safetensors`` or shards listed by ``model.safetensors.index.json``
(``{"weight_map": {tensor name: file name}}``), as ``save_pretrained`` writes them.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from planc.spec import strict_json

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: Headers hold one small JSON entry per tensor; 100 MB is far beyond any real model's.
MAX_HEADER_BYTES = 100_000_000
MAX_INDEX_BYTES = 50_000_000


class WeightsError(ValueError):
    """A weights directory planc cannot read; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class TensorInfo:
    """One stored tensor: the file it is in, its safetensors dtype name and its shape."""

    file: Path
    dtype: str
    shape: tuple[int, ...]


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors of one safetensors file (name -> :class:`TensorInfo`)."""
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise WeightsError(f"{path} is not a safetensors file (it is shorter than its header)")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise WeightsError(f"{path}: a header of {length:,} bytes is not a safetensors header")
            text = handle.read(length)
    except OSError as exc:
        raise WeightsError(f"cannot read {path}: {exc}") from None
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WeightsError(f"{path} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path} is not a safetensors file (its header is not a JSON object)")
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            shape = tuple(int(n) for n in entry["shape"])
            tensors[name] = TensorInfo(path, str(entry["dtype"]), shape)
        except (KeyError, TypeError, ValueError):
            raise WeightsError(f"{path}: the header entry of {name!r} has no valid dtype and shape") from None
    return tensors


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a model directory (one, or the shards its index lists)."""
    index = directory / INDEX_FILE
    if index.is_file():
        return sorted(set(weight_map(directory).values()))
    if (directory / SINGLE_FILE).is_file():
        return [directory / SINGLE_FILE]
    if not directory.is_dir():
        raise WeightsError(f"weights directory not found: {directory}")
    others = sorted(p.name for p in directory.glob("*.bin")) + sorted(p.name for p in directory.glob("*.pt"))
    hint = (
        f" (it has {', '.join(others[:3])}: planc reads safetensors only, never pickles; "
        "convert with transformers: AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(NEW_DIR))"
        if others
        else ""
    )
    raise WeightsError(f"{directory} has neither {SINGLE_FILE} nor {INDEX_FILE}{hint}")


def weight_map(directory: Path) -> dict[str, Path]:
    """``model.safetensors.index.json``'s tensor name -> shard file (each inside ``directory``)."""
    index = directory / INDEX_FILE
    try:
        if index.stat().st_size > MAX_INDEX_BYTES:
            raise WeightsError(f"{index} is too large for a safetensors index")
        data = strict_json.loads(index.read_text(encoding="utf-8"))
    except OSError as exc:
        raise WeightsError(f"cannot read {index}: {exc}") from None
    except ValueError as exc:
        raise WeightsError(f"{index} is not valid JSON ({exc})") from None
    mapping = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(mapping, dict):
        raise WeightsError(f'{index} has no "weight_map" object')
    files = {}
    for name, file_name in mapping.items():
        if not isinstance(file_name, str) or Path(file_name).name != file_name:
            raise WeightsError(f"{index}: shard {file_name!r} of {name!r} is not a file name in {directory}")
        files[name] = directory / file_name
    return files


def read_directory(directory: Path) -> dict[str, TensorInfo]:
    """Every tensor of the model in ``directory`` (checked against the index when there is one)."""
    tensors: dict[str, TensorInfo] = {}
    for file in weight_files(directory):
        if not file.is_file():
            raise WeightsError(f"{file} is listed in {INDEX_FILE} but missing")
        tensors.update(read_header(file))
    if (directory / INDEX_FILE).is_file():
        for name, file in weight_map(directory).items():
            if name not in tensors or tensors[name].file != file:
                raise WeightsError(f"{directory / INDEX_FILE} puts {name!r} in {file.name}, which does not hold it")
    return tensors
