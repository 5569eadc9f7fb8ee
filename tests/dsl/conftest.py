import pytest

from .helpers import TEST_PLUGINS


@pytest.fixture(autouse=True)
def _fixed_plugins(monkeypatch):
    monkeypatch.setenv("PLANC_PLUGINS", TEST_PLUGINS)
