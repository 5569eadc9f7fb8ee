"""What the CLI reads and writes besides .plan files: output paths that cannot be written, the
input plan never overwritten, a run directory's plan.json read back, names that do not print."""

import json
import xml.etree.ElementTree as ET

import pytest

from planc.cli import main
from planc.launch import write_run_dir
from planc.strategies.registry import load_registry

PLAN = """model { preset = "gpt2" }
hardware { device = "A100-80GB"  per_node = 2 }
train { global_batch = 16 }
"""


@pytest.fixture
def plan_file(tmp_path):
    path = tmp_path / "gpt2.plan"
    path.write_text(PLAN)
    return path


@pytest.mark.parametrize("command", [["compile", "-o"], ["explain", "--svg"]])
def test_an_output_that_cannot_be_written_is_a_clear_error(command, plan_file, tmp_path, capsys):
    flag = command[1]
    cases = {
        str(tmp_path / "no" / "such" / "dir" / "x"): "the directory",
        str(tmp_path): "is a directory",
        str(plan_file): "is the input file; writing there would overwrite it",
    }
    for output, expected in cases.items():
        assert main([command[0], str(plan_file), flag, output]) == 1
        err = capsys.readouterr().err
        assert expected in err and "hint:" in err and "internal error" not in err, err
    assert plan_file.read_text() == PLAN  # never overwritten


@pytest.mark.parametrize("command, example", [(["compile", "-o"], "train.py"), (["explain", "--svg"], "plan.svg")])
def test_a_directory_as_output_gets_a_file_name_of_the_right_kind(command, example, plan_file, tmp_path, capsys):
    """-o writes a program, --svg a picture: the hint names a file of that kind in the directory."""
    assert main([command[0], str(plan_file), command[1], str(tmp_path)]) == 1
    assert f"hint: give a file name, e.g. {tmp_path / example}\n" in capsys.readouterr().err


def test_a_symlinked_plan_stays_a_link_after_fmt(plan_file, tmp_path):
    link = tmp_path / "link.plan"
    link.symlink_to(plan_file.name)
    assert main(["fmt", "--write", str(link)]) == 0
    assert link.is_symlink() and plan_file.read_text() != PLAN  # the target was reformatted


def test_explain_reads_a_run_directorys_plan_json(plan_file, tmp_path, capsys):
    from planc.codegen import compile_plan
    from planc.dsl import load_plan

    run_dir = tmp_path / "run"
    write_run_dir(run_dir, compile_plan(load_plan(plan_file, strategies=load_registry()), load_registry()))
    assert main(["explain", str(run_dir / "plan.json")]) == 0
    from_json = capsys.readouterr().out
    assert main(["explain", str(plan_file)]) == 0
    from_plan = capsys.readouterr().out
    assert (
        from_json.split("\n", 1)[1].split("layouts scored")[0] == from_plan.split("\n", 1)[1].split("layouts scored")[0]
    )

    # An edited plan.json is checked like a .plan file: fields, then the cross-key rules.
    record = json.loads((run_dir / "plan.json").read_text())
    record["plan"]["train"]["global_batch"] = 7
    record["plan"]["layout"]["dp"] = 2
    (tmp_path / "edited.json").write_text(json.dumps(record))
    assert main(["explain", str(tmp_path / "edited.json")]) == 1
    err = capsys.readouterr().err
    assert "is not a valid plan: train.global_batch: global_batch = 7 is not divisible" in err
    record["plan"]["hardware"]["per_node"] = "two"
    (tmp_path / "edited.json").write_text(json.dumps(record))
    assert main(["explain", str(tmp_path / "edited.json")]) == 1
    assert "hardware.per_node: Input should be a valid integer" in capsys.readouterr().err


def test_names_that_do_not_print_are_shown_escaped(tmp_path, capsys):
    # ESC [31m would turn a terminal red; a newline would forge a line; XML 1.0 forbids ESC.
    hostile = tmp_path / "hostile.plan"
    hostile.write_text(PLAN.replace("model {", 'model "a\\u001b[31mb\\nc" {'))
    svg = tmp_path / "out.svg"
    assert main(["explain", str(hostile), "--svg", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "a\\x1b[31mb\\nc" in out
    ET.fromstring(svg.read_text())  # well-formed
    assert main(["check", str(hostile)]) == 0
    assert "a\\x1b[31mb\\nc" in capsys.readouterr().out
