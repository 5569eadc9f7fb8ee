from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLANS = ROOT / "plans"


@pytest.fixture
def root() -> Path:
    return ROOT
