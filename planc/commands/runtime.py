"""What the commands that train or touch weights need installed, and how to say it when it is missing.

``pip install planc`` gives the planner (check, fmt, explain, compile, presets, docs) without
PyTorch; ``pip install 'planc[run]'`` adds the runtime: torch and safetensors.
"""

from __future__ import annotations

import importlib.util

INSTALL_HINT = (
    "install the runtime with: pip install 'planc[run]'  (PyTorch's CPU build: pip install torch==2.13.0; "
    "a CUDA build: see `planc docs gpu`)"
)


def require_torch(command: str, *modules: str) -> None:
    """Raise a PlanError naming ``command`` and the install command when torch (or ``modules``) is missing."""
    from planc.errors import PlanError

    for module in ("torch", *modules):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise PlanError(f"{command} needs {module}, which is not installed", hint=INSTALL_HINT)
