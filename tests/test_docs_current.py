"""The plans and `planc explain` outputs pasted into the docs are the ones planc produces now.

Regenerate with `python tools/refresh_docs.py` after a change that moves them.
"""

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _refresh_module():
    spec = importlib.util.spec_from_file_location("refresh_docs", ROOT / "tools" / "refresh_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _without_timings(text: str) -> str:
    return re.sub(r"scored in [0-9.]+ s", "scored in _ s", text)


def test_worked_examples_are_current(monkeypatch):
    refresh = _refresh_module()
    monkeypatch.chdir(ROOT)
    for name in refresh.DOCS:
        text = (ROOT / name).read_text(encoding="utf-8")
        assert refresh.MARKED_BLOCK.search(text), f"{name} has no generated blocks"
        assert _without_timings(refresh.refresh(text)) == _without_timings(text), (
            f"{name} is out of date: run `python tools/refresh_docs.py`"
        )
