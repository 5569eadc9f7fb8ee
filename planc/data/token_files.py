"""Token files: flat arrays of token ids on disk, in the layouts planc, nanoGPT and Megatron-LM write.

A token file is one long stream of token ids (documents joined by a separator token), read
through a memory map and never loaded whole. Three layouts are understood:

* **planc** -- ``NAME.bin`` (little-endian ``uint16`` or ``uint32``, no header) with a sidecar
  ``NAME.bin.json`` naming the dtype, the tokenizer's vocabulary size, the token count, the
  largest id and where the tokens came from (``planc prepare`` writes both). A hand-written
  sidecar with just ``{"dtype": "uint32"}`` makes any headerless file readable.
* **nanoGPT** -- ``train.bin`` / ``val.bin`` without a sidecar: ``uint16``, no header, as
  nanoGPT's ``prepare.py`` scripts write them (``np.memmap(..., dtype=np.uint16)``). Its
  ``meta.pkl`` is a pickle and is never read; the largest id is found by scanning instead.
* **Megatron-LM** -- an indexed dataset ``PREFIX.bin`` + ``PREFIX.idx`` (the ``MMIDIDX`` index
  of ``megatron/core/datasets/indexed_dataset.py``). The index gives the dtype and the sequence
  lengths; the ``.bin`` is read as one stream of its documents in order, which is how Megatron's
  own GPT dataset samples it (samples cross document boundaries). Document boundaries, blending
  weights and Megatron's cached shuffle indices are not used.

Everything else named as data is a text file read as raw bytes (:mod:`planc.runtime.data`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

#: Token dtypes a planc sidecar may name (little-endian; nanoGPT's is uint16).
DTYPES: dict[str, np.dtype] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
#: The sidecar's ``format`` value.
SIDECAR_FORMAT = "planc-tokens"
SIDECAR_VERSION = 1

#: Megatron-LM's index: magic, then version (u64), dtype code (u8), sequence and document counts (u64).
MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
#: Megatron's DType codes (megatron/core/datasets/indexed_dataset.py); only integer ones hold tokens.
MEGATRON_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 8: "uint16"}

#: ``max_id`` scans read the memory map this many tokens at a time.
SCAN_CHUNK = 1 << 24

Layout = Literal["planc", "nanogpt", "megatron"]


class TokenFileError(ValueError):
    """A token file (or its sidecar or index) cannot be used; the message says what to do."""


def sidecar_path(path: Path) -> Path:
    """``train.bin`` -> ``train.bin.json``."""
    return path.with_name(path.name + ".json")


def megatron_prefix(path: Path) -> Path | None:
    """The Megatron prefix when ``path`` names one half (or the prefix) of a ``.bin``/``.idx`` pair."""
    prefix = path.with_suffix("") if path.suffix in (".bin", ".idx") else path
    if prefix.with_name(prefix.name + ".idx").is_file() and prefix.with_name(prefix.name + ".bin").is_file():
        return prefix
    return None


def is_token_path(path: Path) -> bool:
    """True when ``path`` names token data rather than a text file: a ``.bin``/``.idx`` name, a file
    with a sidecar, or a Megatron prefix."""
    return path.suffix in (".bin", ".idx") or sidecar_path(path).is_file() or megatron_prefix(path) is not None


@dataclass(frozen=True)
class TokenFile:
    """A token file opened for reading: where it is, how its ids are stored, what is known about them."""

    path: Path
    """The file holding the ids (the ``.bin``)."""
    layout: Layout
    dtype: np.dtype
    tokens: int
    """Number of token ids in the stream."""
    offset: int = 0
    """Bytes before the first id."""
    vocab_size: int | None = None
    """The tokenizer's vocabulary size, when a sidecar records it."""
    max_id: int | None = None
    """The largest id, when a sidecar records it (else :meth:`scan_max_id` finds it)."""
    sidecar: dict[str, Any] | None = None

    def array(self) -> np.memmap:
        """The ids as a read-only memory map (nothing is read until it is indexed)."""
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=(self.tokens,))

    def scan_max_id(self) -> int:
        """The largest id, read through the memory map a chunk at a time (bounded memory)."""
        ids = self.array()
        return int(max(ids[start : start + SCAN_CHUNK].max() for start in range(0, self.tokens, SCAN_CHUNK)))

    @property
    def nbytes(self) -> int:
        return self.tokens * self.dtype.itemsize

    def describe(self) -> str:
        """``train.bin: 1,234,567 tokens (uint16, planc layout, tokenizer vocab 32000)``."""
        details = [str(self.dtype.name), f"{self.layout} layout"]
        if self.vocab_size is not None:
            details.append(f"tokenizer vocab {self.vocab_size}")
        return f"{self.path}: {self.tokens:,} tokens ({', '.join(details)})"


def open_token_file(path: str | Path) -> TokenFile:
    """Open the token data at ``path`` (any of the three layouts); raise TokenFileError if it cannot be read."""
    path = Path(path)
    prefix = megatron_prefix(path)
    if prefix is not None:
        return _open_megatron(prefix)
    if path.suffix == ".idx":
        raise TokenFileError(f"{path} is a Megatron index, but {path.with_suffix('.bin')} is missing")
    if not path.is_file():
        raise TokenFileError(f"no such token file: {path}")
    side = sidecar_path(path)
    sidecar = _read_sidecar(side) if side.is_file() else None
    dtype = DTYPES["uint16"] if sidecar is None else _sidecar_dtype(sidecar, side)
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise TokenFileError(
            f"{path} has {size} bytes, not a whole number of {dtype.name} ids"
            + ("" if sidecar else f"; without a sidecar it is read as nanoGPT's uint16 (write {side.name} ")
            + ("" if sidecar else 'with {"dtype": "uint32"} if it holds uint32 ids)')
        )
    tokens = size // dtype.itemsize
    if sidecar is not None and sidecar.get("tokens") is not None and sidecar["tokens"] != tokens:
        raise TokenFileError(
            f"{path} holds {tokens:,} tokens but its sidecar {side.name} says {sidecar['tokens']:,}: "
            "the file is truncated or was replaced; prepare it again"
        )
    return TokenFile(
        path=path,
        layout="planc" if sidecar is not None else "nanogpt",
        dtype=dtype,
        tokens=tokens,
        vocab_size=_optional_int(sidecar, "vocab_size", side),
        max_id=_optional_int(sidecar, "max_id", side),
        sidecar=sidecar,
    )


def _read_sidecar(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TokenFileError(f"cannot read the sidecar {path}: {exc}") from None
    if not isinstance(document, dict):
        raise TokenFileError(f"the sidecar {path} is not a JSON object")
    return document


def _sidecar_dtype(sidecar: dict, path: Path) -> np.dtype:
    name = sidecar.get("dtype", "uint16")
    if name not in DTYPES:
        raise TokenFileError(f"the sidecar {path} names dtype {name!r}; planc reads {' or '.join(DTYPES)}")
    return DTYPES[name]


def _optional_int(sidecar: dict | None, key: str, path: Path) -> int | None:
    if sidecar is None or sidecar.get(key) is None:
        return None
    value = sidecar[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TokenFileError(f"the sidecar {path} has {key} = {value!r}; expected a whole number >= 0")
    return value


def _open_megatron(prefix: Path) -> TokenFile:
    """Read a Megatron ``.idx`` header and sequence lengths; the ``.bin`` must hold exactly those ids."""
    index, data = prefix.with_name(prefix.name + ".idx"), prefix.with_name(prefix.name + ".bin")
    try:
        with index.open("rb") as handle:
            header = handle.read(len(MEGATRON_MAGIC) + 8 + 1 + 8 + 8)
            magic = header[: len(MEGATRON_MAGIC)]
            if magic != MEGATRON_MAGIC:
                raise TokenFileError(f"{index} is not a Megatron-LM mmap index (it does not start with MMIDIDX)")
            version, code, sequences, _documents = struct.unpack("<QBQQ", header[len(MEGATRON_MAGIC) :])
            lengths = np.fromfile(handle, dtype="<i4", count=sequences)
    except OSError as exc:
        raise TokenFileError(f"cannot read {index}: {exc.strerror or exc}") from None
    if version != 1:
        raise TokenFileError(f"{index} is a version {version} Megatron index; planc reads version 1")
    if code not in MEGATRON_DTYPES:
        raise TokenFileError(f"{index} stores dtype code {code}, which is not an integer token type")
    if len(lengths) != sequences:
        raise TokenFileError(f"{index} is truncated: it announces {sequences} sequences")
    dtype = np.dtype(MEGATRON_DTYPES[code]).newbyteorder("<")
    tokens = int(lengths.sum(dtype=np.int64))
    size = data.stat().st_size
    if size != tokens * dtype.itemsize:
        raise TokenFileError(
            f"{data} has {size:,} bytes, but its index {index.name} describes {tokens:,} {dtype.name} ids "
            f"({tokens * dtype.itemsize:,} bytes): the pair does not belong together"
        )
    return TokenFile(path=data, layout="megatron", dtype=dtype, tokens=tokens)


def write_sidecar(path: Path, **fields: Any) -> dict[str, Any]:
    """Write ``NAME.bin.json`` beside a token file (atomically); returns the document written."""
    from planc.fileio import write_text_atomically

    document = {"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, **fields}
    write_text_atomically(sidecar_path(path), json.dumps(document, indent=2) + "\n")
    return document


def dtype_for_vocab(vocab_size: int) -> str:
    """The smallest dtype that holds every id of a vocabulary: uint16 up to 65,536 ids, else uint32."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"
