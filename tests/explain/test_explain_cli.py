"""``planc explain``: text, --json, --svg and exit status, on plan.json files.

(.plan files go through planc.dsl; these tests write plan.json so they do not depend on it.)
"""

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from planc.cli import main
from planc.spec import build_plan


def write(tmp_path, name, raw):
    path = tmp_path / f"{name}.json"
    path.write_text(build_plan(raw, source=name).to_json())
    return str(path)


FITS = {
    "model": {"preset": "gpt2-medium"},
    "hardware": {"device": "A100-80GB", "nodes": 1},
    "train": {"global_batch": 64},
}
PIPELINE = {
    "model": {"preset": "llama2-13b", "seq_len": 2048},
    "hardware": {"device": "A100-40GB", "nodes": 2},
    "train": {"global_batch": 64},
    "layout": {"pp": 4, "tp": 2, "schedule": "1f1b"},
}
TOO_BIG = {
    "model": {"preset": "llama2-7b"},
    "hardware": {"device": "A100-80GB", "nodes": 1, "per_node": 1},
    "train": {"global_batch": 8, "micro_batch": 1},
    "layout": {"tp": 1, "pp": 1, "dp": 1, "zero": 0, "recompute": "none"},
}


def test_text_explanation(tmp_path, capsys):
    assert main(["explain", write(tmp_path, "fits", FITS)]) == 0
    out = capsys.readouterr().out
    for part in ("chosen", "memory per device", "step time", "throughput", "bottleneck", "MFU"):
        assert part in out


def test_json_has_the_documented_keys(tmp_path, capsys):
    assert main(["explain", write(tmp_path, "fits", FITS), "--json", "--top", "3"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d["layout"]) == {
        "tp",
        "pp",
        "dp",
        "zero",
        "recompute",
        "schedule",
        "micro_batch",
        "virtual_stages",
        "sequence_parallel",
    }
    assert {
        "params_bytes",
        "grads_bytes",
        "optimizer_bytes",
        "activations_bytes",
        "transient_bytes",
        "total_bytes",
        "capacity_bytes",
    } <= set(d["memory"])
    assert {"step_s", "compute_s", "bubble_s", "exposed_comm_s"} <= set(d["time"])
    assert {"tokens_per_s", "model_tflops_per_device", "hardware_tflops_per_device", "mfu"} <= set(d["throughput"])
    assert d["model"]["params"] == build_plan(FITS).model.params
    assert d["fits"] is True and len(d["alternatives"]) <= 3
    assert all({"strategy", "reason"} <= set(r) for r in d["rejected"])
    # the memory parts add up to the total
    m = d["memory"]
    parts = m["params_bytes"] + m["grads_bytes"] + m["optimizer_bytes"] + m["activations_bytes"] + m["transient_bytes"]
    assert parts + m["master_bytes"] == pytest.approx(m["total_bytes"])
    # and the step time to its parts
    t = d["time"]
    assert t["step_s"] == pytest.approx(
        t["compute_s"]
        + t["recompute_s"]
        + t["bubble_s"]
        + t["optimizer_s"]
        + sum(t["exposed_comm_s"].values())
        + sum(t["other_s"].values())
    )


def test_pipeline_timeline_and_svg(tmp_path, capsys):
    svg = tmp_path / "out.svg"
    code = main(["explain", write(tmp_path, "pp", PIPELINE), "--svg", str(svg)])
    out = capsys.readouterr().out
    assert code == 0
    assert "pipeline schedule (1f1b, 4 stages" in out and "rank   0 |" in out
    root = ET.fromstring(svg.read_text())
    assert root.tag.endswith("svg")
    assert len(root.findall(".//{http://www.w3.org/2000/svg}rect")) > 10


def test_a_fixed_layout_that_does_not_fit_exits_1_and_says_what_would(tmp_path, capsys):
    assert main(["explain", write(tmp_path, "big", TOO_BIG)]) == 1
    captured = capsys.readouterr()
    assert "DOES NOT FIT" in captured.out
    assert "does not fit" in captured.err and "short by" in captured.err


def test_when_nothing_fits_explain_shows_the_closest_layout_not_a_choice(tmp_path, capsys):
    """Llama 3 8B on one H100: model states alone (8 B x 16 bytes) exceed 80 GB, so no layout is
    scored. The layout line says "closest", not "chosen", and why nothing was scored -- not a rung
    and a margin, which only a choice has."""
    path = tmp_path / "one.plan"
    path.write_text(
        'model { preset = "llama3-8b" }\nhardware { device = "H100-SXM" per_node = 1 }\ntrain { global_batch = 8 }\n'
    )
    assert main(["explain", str(path)]) == 1
    out = capsys.readouterr().out
    assert "  closest   TP 1 × PP 1 × DP 1" in out and "  chosen " not in out
    assert "nothing fits: 0 layouts scored in " in out and "model states alone exceed the device" in out
    assert "rung:" not in out and "margin ±" not in out


def test_bad_arguments_are_clear_errors(tmp_path, capsys):
    assert main(["explain", str(tmp_path / "missing.json")]) == 1
    assert "no such file" in capsys.readouterr().err
    plan = write(tmp_path, "fits", FITS)
    for command in ("explain", "compile", "run"):
        for bad in ("2", "-1", "nan", "inf", "five"):
            with pytest.raises(SystemExit) as stopped:  # argparse: usage line, then the reason, exit 2
                main([command, plan, "--tolerance", bad])
            assert stopped.value.code == 2
            err = capsys.readouterr().err
            assert "argument --tolerance" in err and "e.g. --tolerance 0.05" in err, err


@pytest.mark.parametrize(
    "bad, says",
    [
        (["--tolerance", "abc"], "argument --tolerance: 'abc' is not a number"),
        (["--tolerance", "nan"], "argument --tolerance: nan is not a finite number"),
        (["--tolerance", "inf"], "argument --tolerance: inf is not a finite number"),
        (["--top", "x"], "argument --top: invalid int value: 'x'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_argument_errors_under_json_print_one_json_error(tmp_path, capsys, bad, says):
    """docs/language.md: with --json, stdout holds exactly one JSON value, a failure's included;
    argparse's own errors too (usage and reason still on stderr, exit 2)."""
    plan = write(tmp_path, "fits", FITS)
    with pytest.raises(SystemExit) as stopped:
        main(["explain", "--json", plan, *bad])
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    error = json.loads(captured.out)["error"]
    assert error["message"].startswith(says) and error["location"] is None
    assert "planc explain --help" in error["hint"]
    assert error["errors"] == [{k: error[k] for k in ("message", "location", "hint")}]  # the documented shape
    assert says in captured.err and "usage: planc" in captured.err


def test_argument_errors_without_json_print_nothing_on_stdout(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["explain", write(tmp_path, "fits", FITS), "--top", "x"])
    assert capsys.readouterr().out == ""


@pytest.mark.dist
def test_explain_never_imports_torch():
    code = (
        "import sys; from planc.cli import main; import planc.planner, planc.explain.report, planc.explain.svg; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_json_memory_parts_add_up_with_a_master_copy(tmp_path, capsys):
    """bf16 under FSDP keeps an fp32 master apart from Adam's states: each is listed once.

    Per parameter (planc.cost.memory.runtime_state_bytes, ZeRO-3 bf16, AdamW): master 4 B, Adam
    m and v 8 B, both sharded over dp = 8; so optimizer_bytes is twice master_bytes exactly.
    """
    raw = {
        "model": {"preset": "llama2-7b"},
        "hardware": {"device": "A100-80GB", "nodes": 1},
        "train": {"global_batch": 64, "micro_batch": 1, "precision": "bf16"},
        "layout": {"tp": 1, "pp": 1, "dp": 8, "zero": 3},
    }
    assert main(["explain", write(tmp_path, "fsdp", raw), "--json"]) == 0
    m = json.loads(capsys.readouterr().out)["memory"]
    assert m["master_bytes"] > 0
    assert m["optimizer_bytes"] == pytest.approx(2 * m["master_bytes"])
    parts = ("params_bytes", "master_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "transient_bytes")
    assert sum(m[k] for k in parts) == pytest.approx(m["total_bytes"])
