"""Start from Hugging Face weights: fill each rank's local shards straight from the safetensors.

For every parameter a rank holds -- a whole tensor, a tensor-parallel or FSDP shard (a DTensor),
or a pipeline stage's parameters -- :func:`load_pretrained` asks the DTensor which block of the
full tensor it holds (``__create_chunk_list__``, the offsets and sizes DCP itself saves and
loads by), maps those rows through :mod:`planc.weights.hf_names` (RoPE permutation, fused QKV,
Conv1D transpose, vocabulary padding) and reads only the covering slice of the Hugging Face tensor
with ``safetensors``' memory-mapped ``get_slice``. No rank reads a tensor it does not hold a part
of, and none materialises a full tensor it only holds a shard of (beyond a head's worth of rows
around its shard, where the RoPE permutation needs them).

Padding rows of the embedding and output (``padded_vocab > vocab``) are zero: no token id reaches
them and the loss masks them out. The values depend only on the files, so every layout starts
from the same model, as with seeded init.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch import nn

from planc.runtime.transformer import canonical_name, init_weights
from planc.spec import ModelSpec
from planc.spec.hf_config import load_config_json
from planc.weights.hf_names import MODEL_TYPE_FAMILY, TensorSource, tensor_sources
from planc.weights.plan_checks import resolve_names, weight_problems, weights_directory
from planc.weights.safetensors_index import WeightsError, read_directory


def initialise(model: nn.Module, spec: ModelSpec, seed: int, root: str | Path | None = None) -> None:
    """The plan's starting weights: seeded init, or ``init = pretrained``'s Hugging Face weights
    (a relative ``weights`` path under ``root``: the plan's data root or the program's --data-root)."""
    if spec.init == "pretrained":
        load_pretrained(model, spec, weights_directory(spec, root))
    else:
        init_weights(model, seed, spec)


@torch.no_grad()
def load_pretrained(model: nn.Module, spec: ModelSpec, directory: str | Path | None = None) -> None:
    """Overwrite every parameter of ``model`` (on a real device) with the weights in ``directory``
    (default: ``spec.weights``); raises :class:`WeightsError` when they are not ``spec``'s model."""
    directory = Path(directory if directory is not None else spec.weights or "")
    problems = weight_problems(spec, directory)  # planc check said the same; the files may have changed since
    if problems:
        raise WeightsError(f"cannot start from the weights in {directory}: " + "; ".join(m for m, _ in problems))
    family = MODEL_TYPE_FAMILY[load_config_json(directory / "config.json")["model_type"]]
    stored = read_directory(directory)
    names = resolve_names(stored, family)
    sources = tensor_sources(spec, family)
    from safetensors import safe_open

    with ExitStack() as files:
        handles: dict[Path, Any] = {}  # safetensors' safe_open handles (untyped)

        def open_slice(hf_name: str):
            info = stored[names[hf_name]]
            if info.file not in handles:
                handles[info.file] = files.enter_context(safe_open(str(info.file), framework="pt"))
            return handles[info.file].get_slice(names[hf_name])

        for fqn, param in model.named_parameters():
            if param.is_meta:
                raise ValueError(f"parameter {fqn!r} is on the meta device; call model.to_empty(device=...) first")
            source = sources[canonical_name(fqn, spec)]
            offsets, sizes = local_block(param)
            value = read_block(open_slice(source.hf_name), source, offsets, sizes)
            target = param.to_local() if hasattr(param, "to_local") else param
            if tuple(value.shape) != tuple(target.shape):
                shapes = f"{tuple(value.shape)} for a shard of {tuple(target.shape)}"
                raise WeightsError(f"{fqn}: read a block of shape {shapes}")
            target.copy_(value)


def local_block(param: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(offsets, sizes) of the block of the full tensor that this rank's ``param`` holds."""
    if hasattr(param, "__create_chunk_list__"):  # a DTensor: what DCP saves this shard as
        (chunk,) = param.__create_chunk_list__()
        return tuple(chunk.offsets), tuple(chunk.sizes)
    return (0,) * param.ndim, tuple(param.shape)


def read_block(stored, source: TensorSource, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> torch.Tensor:
    """Rows ``offsets[0] .. +sizes[0]`` (and columns ``offsets[1] ..``) of the planc tensor ``source``
    describes, read from the safetensors slice ``stored``, as float32 (padding rows zero)."""
    first, count = offsets[0], sizes[0]
    hf_rows = source.rows.hf_rows(first, first + count)
    real = [r for r in hf_rows if r is not None]
    columns = slice(offsets[1], offsets[1] + sizes[1]) if len(sizes) > 1 else None
    out = torch.zeros(sizes, dtype=torch.float32)
    if not real:
        return out
    low, high = min(real), max(real) + 1  # the covering range, then the rows in planc's order
    if columns is None:
        block = stored[low:high]
    elif source.transpose:  # GPT-2 Conv1D [in, out]: planc's rows are its columns
        block = stored[columns, low:high].t()
    else:
        block = stored[low:high, columns]
    index = torch.tensor([r - low for r in real], dtype=torch.long)
    keep = torch.tensor([i for i, r in enumerate(hf_rows) if r is not None], dtype=torch.long)
    out[keep] = block.index_select(0, index).to(torch.float32)
    return out
