"""Golden error messages: each ``errors/NAME.plan`` holds one mistake, ``errors/NAME.expected``
the exact text ``planc check`` must print for it (written by hand from what the message should
say, then checked against the output).
"""

from pathlib import Path

import pytest

from .helpers import HERE, run_cli

CASES = sorted(p.stem for p in (HERE / "errors").glob("*.plan"))


def test_there_are_enough_distinct_cases():
    assert len(CASES) >= 25
    assert all((HERE / "errors" / f"{name}.expected").is_file() for name in CASES)


@pytest.mark.parametrize("name", CASES)
def test_error_message(name, capsys, monkeypatch):
    monkeypatch.chdir(HERE)
    code, out, err = run_cli(capsys, "check", f"errors/{name}.plan")
    expected = Path(HERE / "errors" / f"{name}.expected").read_text(encoding="utf-8")
    assert code == 1
    assert out == ""
    assert err == expected
