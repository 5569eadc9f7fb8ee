"""Writing files so that a crash leaves the old file or the new one, never half of either."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomically(path: Path, text: str) -> None:
    """Replace (or create) ``path`` with ``text``; an existing file keeps its permissions, and a
    symbolic link keeps pointing where it did (the file it names is replaced, not the link)."""
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    if path.exists():
        mode = path.stat().st_mode & 0o7777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    directory = path.parent if str(path.parent) else Path(".")
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="\n") as out:
            out.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_output(
    path: Path, text: str, *, option: str, inputs: tuple[Path, ...] = (), example: str = "train.py"
) -> None:
    """Write a file named on the command line (``option`` says by which flag), or raise a
    PlanError that says why it cannot be written; never overwrite one of ``inputs``. ``example``
    is the file name the hint suggests when ``path`` is a directory (a program, a picture)."""
    from planc.errors import PlanError

    path = Path(path)
    if path.is_dir():
        raise PlanError(f"{option} {path} is a directory", hint=f"give a file name, e.g. {path / example}")
    for source in inputs:
        if path.exists() and Path(source).exists() and path.samefile(source):
            raise PlanError(
                f"{option} {path} is the input file; writing there would overwrite it",
                hint="choose another output file name",
            )
    parent = path.parent
    if not parent.is_dir():
        raise PlanError(
            f"cannot write {path}: the directory {parent} does not exist",
            hint=f"create it first (mkdir -p {parent}), or write somewhere else",
        )
    try:
        write_text_atomically(path, text)
    except OSError as exc:
        raise PlanError(
            f"cannot write {path}: {exc.strerror or exc}", hint="check the path and the directory's permissions"
        ) from None
