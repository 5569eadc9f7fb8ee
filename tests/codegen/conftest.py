from pathlib import Path

import pytest

from planc.dsl.load import load_plan

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
GOLDEN = Path(__file__).resolve().parent / "golden"


def has_powersgd() -> bool:
    from planc.strategies.registry import load_registry

    return "powersgd" in load_registry()


@pytest.fixture
def in_root(monkeypatch):
    """Plans are loaded by repository-relative paths, so emitted programs name no machine path."""
    monkeypatch.chdir(ROOT)
    return ROOT


def plan_at(relative: str):
    from planc.strategies.registry import load_registry

    return load_plan(Path(relative), strategies=load_registry())
