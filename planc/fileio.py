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
    mode = path.stat().st_mode & 0o7777 if path.exists() else default_mode()
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


def default_mode(*, directory: bool = False) -> int:
    """The mode ``open()`` or ``mkdir()`` would give a new file or directory under the process's umask.

    ``tempfile.mkstemp``/``mkdtemp`` create 0600 files and 0700 directories whatever the umask, so what
    is written through them and then renamed into place must be given this mode, or it stays private.
    """
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def publish_modes(root: Path) -> None:
    """Give ``root`` (a directory made by ``mkdtemp``) and everything in it the umask's default modes."""
    for folder, _, files in os.walk(root):
        os.chmod(folder, default_mode(directory=True))
        for name in files:
            os.chmod(os.path.join(folder, name), default_mode())


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
