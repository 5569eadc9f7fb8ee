from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PLANS = ROOT / "plans"
EXAMPLE_PLANS = sorted(PLANS.glob("*.plan"))

#: The strategy names the tests may rely on (all registered by planc's own pyproject.toml);
#: fixing PLANC_PLUGINS keeps messages stable when other plugins are installed.
TEST_PLUGINS = "ddp,zero1,fsdp"


@pytest.fixture(autouse=True)
def _fixed_plugins(monkeypatch):
    monkeypatch.setenv("PLANC_PLUGINS", TEST_PLUGINS)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``planc ARGV`` in-process: (exit code, stdout, stderr)."""
    from planc.cli import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err
