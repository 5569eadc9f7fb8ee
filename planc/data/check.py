"""Check-time checks of a plan's data files: do the ids fit the model's vocabulary, is there enough data.

``planc check`` runs these when the files are readable on the checking machine (numpy only, no
torch). The largest id comes from the sidecar when it records one (free), else from a scan of the
memory map when the file is at most :data:`SCAN_LIMIT` bytes; a larger file without a recorded
``max_id`` is checked batch by batch at run time instead, and check says so in a note.
"""

from __future__ import annotations

from planc.data.paths import is_token_path, resolve
from planc.data.token_files import TokenFile, TokenFileError, open_token_file
from planc.spec.issues import SpecIssue

#: Scan token files up to this size at check time (about a quarter of a second from the page cache).
SCAN_LIMIT = 256 * 1024**2

BYTE_VOCAB = 256


def byte_vocab_message(key: str, path: str, vocab: int) -> str:
    """Why a text file read as bytes cannot feed a model whose vocabulary is not 256."""
    return (
        f"{key} = {path!r} is a text file, read as raw bytes (ids 0..255), which needs model.vocab = "
        f"{BYTE_VOCAB}, but vocab = {vocab}"
    )


BYTE_VOCAB_HINT = (
    "tokenize it with `planc prepare TEXT --tokenizer tokenizer.json --out DIR` and name DIR/train.bin, "
    f"or set vocab = {BYTE_VOCAB} for a byte-level model"
)


def check_data_files(plan) -> tuple[list[SpecIssue], list[str]]:
    """(issues, notes) about ``train.data`` and ``train.val_data`` of ``plan`` against its model."""
    issues: list[SpecIssue] = []
    notes: list[str] = []
    opened: dict[str, TokenFile] = {}
    for key in ("data", "val_data"):
        written = getattr(plan.train, key)
        if written is None or written == "synthetic":
            continue
        path = resolve(written, plan.data_root)
        if is_token_path(path):
            token_file = _check_token_file(plan, key, path, written, issues, notes)
            if token_file is not None:
                opened[key] = token_file
        else:
            _check_text_file(plan, key, path, issues)
    if len(opened) == 2:
        issues += _tokenizer_mismatch(opened["data"], opened["val_data"])
    return issues, notes


def _check_token_file(plan, key: str, path, shown: str, issues: list[SpecIssue], notes: list[str]) -> TokenFile | None:
    """Open one token file and check its length and largest id (``shown``: the path as the plan writes it)."""
    model, where = plan.model, ("train", key)
    try:
        token_file = open_token_file(path)
    except TokenFileError as exc:
        issues.append(SpecIssue(where, str(exc), "run `planc prepare` again, or check the path"))
        return None
    if token_file.tokens < model.seq_len + 1:
        issues.append(
            SpecIssue(
                where,
                f"{shown} has {token_file.tokens} tokens, fewer than one sequence of seq_len + 1 = {model.seq_len + 1}",
                "use more data or a shorter seq_len",
            )
        )
    largest, how = token_file.max_id, "its sidecar records"
    if largest is None and token_file.nbytes <= SCAN_LIMIT:
        largest, how = token_file.scan_max_id(), "found by scanning it"
    if largest is None:
        notes.append(
            f"train.{key}: {shown} ({token_file.nbytes / 1024**3:.1f} GiB) records no max_id and was not scanned; "
            f"every batch's ids are checked against vocab = {model.vocab} at run time"
        )
    elif largest >= model.vocab:
        size = f"the tokenizer's {token_file.vocab_size}" if token_file.vocab_size else f"at least {largest + 1}"
        issues.append(
            SpecIssue(
                where,
                f"{shown} holds token id {largest} ({how}), but model.vocab = {model.vocab} (ids 0..{model.vocab - 1})",
                f"set vocab to {size}, or prepare the data with the model's tokenizer",
            )
        )
    fits = largest is None or largest < model.vocab
    if token_file.vocab_size is not None and token_file.vocab_size > model.vocab and fits:
        notes.append(
            f"train.{key}: the tokenizer of {path.name} has {token_file.vocab_size} ids but model.vocab = "
            f"{model.vocab}; this data fits, text with rarer tokens would not"
        )
    return token_file


def _check_text_file(plan, key: str, path, issues: list[SpecIssue]) -> None:
    model, where = plan.model, ("train", key)
    if model.vocab != BYTE_VOCAB:
        issues.append(
            SpecIssue(
                where, byte_vocab_message(f"train.{key}", str(getattr(plan.train, key)), model.vocab), BYTE_VOCAB_HINT
            )
        )
        return
    size = path.stat().st_size
    if size < model.seq_len + 1:
        issues.append(
            SpecIssue(
                where,
                f"{path} has {size} bytes, fewer than one sequence of seq_len + 1 = {model.seq_len + 1}",
                "use a longer file or a shorter seq_len",
            )
        )


def _tokenizer_mismatch(train: TokenFile, val: TokenFile) -> list[SpecIssue]:
    """Validation data tokenized with another tokenizer would report a meaningless loss."""
    ours, theirs = ((f.sidecar or {}).get("tokenizer") or {} for f in (train, val))
    if ours.get("sha256") and theirs.get("sha256") and ours["sha256"] != theirs["sha256"]:
        return [
            SpecIssue(
                ("train", "val_data"),
                f"{val.path.name} was tokenized with another tokenizer ({theirs.get('path')}) than "
                f"{train.path.name} ({ours.get('path')})",
                "prepare both splits in one `planc prepare` run",
            )
        ]
    return []
