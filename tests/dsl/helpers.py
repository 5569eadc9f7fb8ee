"""Shared by the tests of the .plan front end."""

from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PLANS = ROOT / "plans"
EXAMPLE_PLANS = sorted(PLANS.glob("*.plan"))

#: The strategy names the tests rely on (all registered by planc's own pyproject.toml); fixing
#: PLANC_PLUGINS keeps the messages the same when other plugins are installed.
TEST_PLUGINS = "ddp,zero1,fsdp"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``planc ARGV`` in-process: (exit code, stdout, stderr)."""
    from planc.cli import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err
