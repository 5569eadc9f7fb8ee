"""``planc fmt``: canonical form, a fixed point, nothing lost."""

import os

import pytest
from hypothesis import given, settings

from planc.dsl import ast, format_plan, parse
from planc.dsl.lower import value_of

from .helpers import EXAMPLE_PLANS, run_cli
from .plan_strategies import plan_texts

EXAMPLES = int(os.environ.get("PLANC_FUZZ_EXAMPLES", "150"))


def meaning(plan: ast.PlanFile) -> dict:
    """What a plan says, independent of layout and comments."""
    out = {}
    for block in plan.blocks:
        if isinstance(block, ast.UseBlock):
            name = f"use {block.strategy.text}"
        else:
            name = block.name
        header = None
        if isinstance(block, ast.ModelBlock):
            header = (block.label.value if block.label else None, block.source.value if block.source else None)
        out[name] = (header, {e.key.text: value_of(e.value) for e in block.entries})
    return out


def comments(plan: ast.PlanFile) -> list[str]:
    return sorted(item.text for item in ast.walk(plan) if isinstance(item, ast.Comment))


def check_round_trip(text: str) -> str:
    first = parse(text, "x.plan")
    formatted = format_plan(first)
    second = parse(formatted, "x.plan")
    assert format_plan(second) == formatted, "fmt is not a fixed point"
    assert meaning(second) == meaning(first), "fmt changed what the plan says"
    assert comments(second) == comments(first), "fmt lost or changed a comment"
    return formatted


@pytest.mark.parametrize("path", EXAMPLE_PLANS, ids=lambda p: p.stem)
def test_examples_are_canonical_and_stable(path):
    text = path.read_text()
    assert check_round_trip(text) == text, f"{path.name} is not in canonical form: run planc fmt --write"


@pytest.mark.dist(launches=False)  # as slow as a launch: the slow half of the suite
@settings(max_examples=EXAMPLES, deadline=None)
@given(plan_texts())
def test_fmt_is_a_fixed_point_on_generated_plans(text):
    check_round_trip(text)


def test_canonical_layout():
    source = (
        "layout{tp=8 # tensor parallel\n"
        "sequence_parallel=true}\n"
        "# the model\n"
        'model   "m"{layers=4 hidden   =   1_024 mem=80GiB list=[1 ,2,]\n'
        "\n\n\n"
        "  vocab = 256}\n"
        "use b\n"
        'hardware{device="cpu"}use a{ }\n'
        "# end\n"
    )
    assert format_plan(parse(source, "x")) == (
        "# the model\n"
        'model "m" {\n'
        "  layers = 4\n"
        "  hidden = 1_024\n"
        "  mem    = 80 GiB\n"
        "  list   = [1, 2]\n"
        "\n"
        "  vocab = 256\n"
        "}\n"
        "\n"
        "hardware {\n"
        '  device = "cpu"\n'
        "}\n"
        "\n"
        "layout {\n"
        "  tp                = 8  # tensor parallel\n"
        "  sequence_parallel = true\n"
        "}\n"
        "\n"
        "use b\n"
        "\n"
        "use a\n"
        "\n"
        "# end\n"
    )


def test_fmt_command_print_check_write(tmp_path, capsys):
    path = tmp_path / "p.plan"
    path.write_text('train{global_batch=8}\nmodel{preset="gpt2"}\n')
    path.chmod(0o640)
    canonical = 'model {\n  preset = "gpt2"\n}\n\ntrain {\n  global_batch = 8\n}\n'

    assert run_cli(capsys, "fmt", str(path)) == (0, canonical, "")
    code, _, err = run_cli(capsys, "fmt", "--check", str(path))
    assert code == 1 and "not in canonical form" in err
    assert run_cli(capsys, "fmt", "--write", str(path))[0] == 0
    assert path.read_text() == canonical and (path.stat().st_mode & 0o777) == 0o640
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind
    assert run_cli(capsys, "fmt", "--check", str(path)) == (0, "", "")


def test_fmt_refuses_a_file_that_does_not_parse(tmp_path, capsys):
    path = tmp_path / "bad.plan"
    path.write_text("model { layers 4 }\n")
    code, out, err = run_cli(capsys, "fmt", "--write", str(path))
    assert code == 1 and out == "" and f"{path}:1:16: error:" in err
    assert path.read_text() == "model { layers 4 }\n"  # untouched
