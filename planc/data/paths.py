"""Where a plan's data files are, on the machine that checks the plan and on every training node.

The rule (docs/data.md, "Paths on many nodes"): a data path is carried as written. A relative one
resolves against a *data root*: the directory of the ``.plan`` file when planc checks it
(``Plan.data_root``), and at run time the program's ``--data-root DIR`` when given, else that
same directory. ``--data``/``--val-data`` replace a path outright (relative to the working
directory, as command-line paths are). An absolute path is used as it is everywhere.
"""

from __future__ import annotations

from pathlib import Path

from planc.data.token_files import is_token_path

__all__ = ["is_token_path", "is_file_data", "resolve"]


def is_file_data(data: str | None) -> bool:
    """True when ``data`` names a file (not ``synthetic``, not absent)."""
    return data is not None and data != "synthetic"


def resolve(path_text: str | Path, root: str | Path | None) -> Path:
    """``path_text`` as a path: absolute ones as they are, relative ones under ``root`` (if any)."""
    path = Path(path_text)
    if path.is_absolute() or root is None:
        return path
    return Path(root) / path
