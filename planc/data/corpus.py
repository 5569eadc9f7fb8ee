"""Reading a text corpus as a stream of pieces: what ``planc prepare`` tokenizes.

Inputs are files or directories (searched recursively for ``*.txt``, ``*.md``, ``*.text``,
``*.jsonl``, ``*.ndjson`` and ``*.json``, in sorted order). Two formats, by file name:

* **JSON lines** (``.jsonl``, ``.ndjson``, ``.json``): one JSON object per line; the document is the
  string under ``text_key``. Blank lines are skipped; any other line that is not such an object is
  an error naming the file and line.
* **plain text** (anything else): the whole file is one document. It is read in pieces of about
  :data:`PIECE_BYTES` that end at line ends, so a large file never sits in memory whole, many
  workers can tokenize one file, and the validation split can draw from inside it.

A piece carries its text, whether a document ends with it (the separator goes there), and its
size in bytes (the progress bar counts them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

JSON_LINES_SUFFIXES = (".jsonl", ".ndjson", ".json")
TEXT_SUFFIXES = (".txt", ".md", ".text")
#: A plain-text piece ends at the first line end after this many bytes.
PIECE_BYTES = 8 * 1024


class CorpusError(ValueError):
    """An input cannot be read as text or JSON lines (the message names the file and line)."""


@dataclass(frozen=True)
class Piece:
    text: str
    document_end: bool
    nbytes: int


def corpus_files(inputs: list[Path]) -> list[Path]:
    """The files to read: files as given, directories searched recursively for known suffixes."""
    files: list[Path] = []
    for path in inputs:
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*") if p.is_file() and p.suffix in JSON_LINES_SUFFIXES + TEXT_SUFFIXES
            )
            if not found:
                raise CorpusError(f"{path} holds no {', '.join(TEXT_SUFFIXES + JSON_LINES_SUFFIXES)} files")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise CorpusError(f"no such file or directory: {path}")
    return files


def pieces(path: Path, text_key: str) -> Iterator[Piece]:
    """The pieces of one file, in order."""
    if path.suffix in JSON_LINES_SUFFIXES:
        yield from _json_lines(path, text_key)
    else:
        yield from _plain_text(path)


def _plain_text(path: Path) -> Iterator[Piece]:
    buffer: list[str] = []
    size = 0
    line_number = 0
    with _open(path) as handle:
        try:
            for line_number, line in enumerate(handle, 1):  # noqa: B007 (the error below reports it)
                buffer.append(line)
                size += len(line.encode("utf-8"))
                if size >= PIECE_BYTES:
                    yield Piece("".join(buffer), False, size)
                    buffer, size = [], 0
        except UnicodeDecodeError as exc:
            raise _not_utf8(path, line_number + 1, exc) from None
    yield Piece("".join(buffer), True, size)  # the document's end, even when its last piece is empty


def _json_lines(path: Path, text_key: str) -> Iterator[Piece]:
    line_number = 0
    with _open(path) as handle:
        try:
            for line_number, line in enumerate(handle, 1):  # noqa: B007
                if not line.strip():
                    continue
                yield Piece(_document(path, line_number, line, text_key), True, len(line.encode("utf-8")))
        except UnicodeDecodeError as exc:
            raise _not_utf8(path, line_number + 1, exc) from None


def _document(path: Path, line_number: int, line: str, text_key: str) -> str:
    where = f"{path}:{line_number}"
    try:
        record = json.loads(line)
    except ValueError as exc:
        first = line.lstrip()[:1]
        hint = " (a JSON array: write one object per line)" if first == "[" and line_number == 1 else ""
        raise CorpusError(f"{where}: not a line of JSON lines: {exc}{hint}") from None
    if not isinstance(record, dict):
        raise CorpusError(f"{where}: expected a JSON object with a {text_key!r} field, got {type(record).__name__}")
    if text_key not in record:
        keys = ", ".join(repr(k) for k in list(record)[:8])
        raise CorpusError(f"{where}: no {text_key!r} field (it has {keys}); name the text's field with --text-key")
    text = record[text_key]
    if not isinstance(text, str):
        raise CorpusError(f"{where}: field {text_key!r} is {type(text).__name__}, not a string")
    return text


def _open(path: Path):
    try:
        return path.open("r", encoding="utf-8", newline="")
    except OSError as exc:
        raise CorpusError(f"cannot read {path}: {exc.strerror or exc}") from None


def _not_utf8(path: Path, line_number: int, exc: UnicodeDecodeError) -> CorpusError:
    # Text is decoded in blocks, so the line is where reading stood, not always the bad byte's own.
    return CorpusError(f"{path}: not UTF-8 text near line {line_number} ({exc.reason}); convert it to UTF-8")
