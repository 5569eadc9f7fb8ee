"""Reading plan files safely, and the ``planc check`` command."""

import json
import os
from pathlib import Path

import pytest

from planc.dsl import load_plan
from planc.dsl.load import MAX_PLAN_BYTES
from planc.strategies.registry import load_registry

from .helpers import EXAMPLE_PLANS, PLANS, run_cli

EXPECTED_SUMMARIES = {
    # model name, parameters (3 significant digits), devices: from each plan and the presets.
    "tiny-cpu": "tiny, 875 k params, 4 × cpu",
    "cpu-3d": "tiny-3d, 867 k params, 8 × cpu",
    "from-hf-config": "tiny-llama, 3.16 M params, 4 × cpu",
    "gpt2-small-8xa100": "gpt2, 124 M params, 8 × A100-80GB",
    # 24 x (12h^2 + 13h) + 2 x 50304h (untied) + 2048h (positions) + 2h = 1,418,842,112 for h = 2048
    "gpt3-1.3b-8xa100": "gpt3-1.3b, 1.42 B params, 8 × A100-80GB",
    "llama3-8b-8xh100": "llama3-8b, 8.03 B params, 8 × H100-SXM",
    "llama3-70b-64xh100": "llama3-70b, 70.6 B params, 64 × H100-SXM (8 nodes × 8)",
    "gpt3-175b-1024xa100": "gpt3-175b, 175 B params, 1024 × A100-80GB (128 nodes × 8)",
    "gpt-1t-3072xa100": "gpt-1t, 1.01 T params, 3072 × A100-80GB (384 nodes × 8)",
}


def test_every_example_plan_is_listed():
    assert {p.stem for p in EXAMPLE_PLANS} >= set(EXPECTED_SUMMARIES)


@pytest.mark.parametrize("path", EXAMPLE_PLANS, ids=lambda p: p.stem)
def test_examples_check_ok(path, capsys):
    code, out, err = run_cli(capsys, "check", str(path))
    assert (code, err) == (0, "")
    assert out.endswith(f"{path}: ok — {EXPECTED_SUMMARIES[path.stem]}\n")


def test_example_parameter_counts_by_hand():
    # tiny: V=256 (padded 256), h=128, s=128, l=4, gelu ffn 4h=512, biases, untied, learned positions.
    # per layer = 2 LN (2*2h) + attention 4h^2 + 4h + MLP 2*h*4h + 4h + h
    h = 128
    per_layer = 2 * 2 * h + (4 * h * h + 4 * h) + (2 * h * 4 * h + 4 * h + h)
    total = 256 * h + 128 * h + 4 * per_layer + 2 * h + 256 * h
    assert load_plan(PLANS / "tiny-cpu.plan", strategies=load_registry()).model.params == total == 875_264
    # Megatron's 1T row (Narayanan et al. 2021, Table 1): P = 12lh^2 (1 + 13/(12h) + (V+s)/(12lh))
    # with tied embeddings = 1,008 B (they print 1008.0); planc adds the final LayerNorm (2h).
    l, h, V, s = 128, 25600, 51200, 2048
    formula = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))
    assert load_plan(PLANS / "gpt-1t-3072xa100.plan", strategies=load_registry()).model.params == round(formula) + 2 * h


def test_check_json_is_the_plan(capsys):
    path = PLANS / "llama3-8b-8xh100.plan"
    code, out, err = run_cli(capsys, "check", "--json", str(path))
    assert code == 0 and err == ""
    data = json.loads(out)
    assert data["model"]["name"] == "llama3-8b" and data["model"]["seq_len"] == 8192
    assert data["hardware"]["world_size"] == 8 and data["layout"]["pp"] == 1
    assert data["source"] == str(path)


def test_check_several_files_reports_each_and_fails_if_any_fails(tmp_path, capsys):
    bad = tmp_path / "bad.plan"
    bad.write_text('model { preset = "gpt2" }\n')
    good = PLANS / "tiny-cpu.plan"
    code, out, err = run_cli(capsys, "check", str(good), str(bad), str(good))
    assert code == 1
    assert out.count(": ok — ") == 2
    assert f"{bad}:1:1: error: the plan has no hardware block" in err
    assert f"{bad}:1:1: error: the plan has no train block" in err


def test_check_prints_notes(tmp_path, capsys):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gpt_neox",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "vocab_size": 128,
                "max_position_embeddings": 64,
            }
        )
    )
    plan = tmp_path / "neox.plan"
    plan.write_text('model from "config.json"\nhardware { device = "cpu" }\ntrain { global_batch = 4 }\n')
    code, out, _ = run_cli(capsys, "check", str(plan))
    assert code == 0
    assert f"{plan}: note: config.json: GPT-NeoX's parallel residual" in out


# -- files that are not plans -----------------------------------------------------------------


def _check(capsys, path) -> str:
    code, out, err = run_cli(capsys, "check", str(path))
    assert code == 1 and out == ""
    assert "Traceback" not in err and "internal error" not in err
    return err


def test_missing_file(tmp_path, capsys):
    err = _check(capsys, tmp_path / "nope.plan")
    assert err == f"error: {tmp_path / 'nope.plan'}: no such file\n"


def test_missing_file_suggests_a_near_name(capsys, monkeypatch):
    monkeypatch.chdir(PLANS.parent)
    err = _check(capsys, "plans/tiny-cpu")
    assert "hint: did you mean plans/tiny-cpu.plan?" in err


def test_directory(tmp_path, capsys):
    assert f"error: {tmp_path} is a directory, not a .plan file" in _check(capsys, tmp_path)


def test_empty_file(tmp_path, capsys):
    path = tmp_path / "empty.plan"
    path.write_text(" \n\n")
    assert f"error: {path} is empty" in _check(capsys, path)


def test_binary_file(tmp_path, capsys):
    path = tmp_path / "bin.plan"
    path.write_bytes(bytes(range(256)) * 4)
    assert "is not a text file (it contains NUL bytes)" in _check(capsys, path)


def test_not_utf8(tmp_path, capsys):
    path = tmp_path / "latin1.plan"
    path.write_bytes('model {\n  name = "caf\xe9"\n}\n'.encode("latin-1"))
    err = _check(capsys, path)
    assert err.startswith(f"{path}:2:14: error: the file is not valid UTF-8 text (byte 0xe9 here)")


def test_ten_megabytes(tmp_path, capsys):
    path = tmp_path / "big.plan"
    path.write_text(("# " + "x" * 1000 + "\n") * 10_000)  # ~10 MB of comments
    err = _check(capsys, path)
    assert "is too large for a plan" in err and f"the limit is {MAX_PLAN_BYTES:,}" in err


def test_device_file_is_not_read(capsys):
    assert "error: /dev/zero is not a regular file" in _check(capsys, Path("/dev/zero"))


def test_unreadable_file(tmp_path, capsys, monkeypatch):
    path = tmp_path / "secret.plan"
    path.write_text("model {}\n")

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "open", refuse)  # chmod 000 does not stop root, so refuse directly
    assert f"error: cannot read {path}: permission denied" in _check(capsys, path)


def test_byte_order_mark_and_crlf_are_fine(tmp_path):
    path = tmp_path / "windows.plan"
    text = (PLANS / "tiny-cpu.plan").read_text().replace("\n", "\r\n")
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_plan(path, strategies=load_registry()).model.name == "tiny"


def test_relative_paths_resolve_against_the_plan_file(tmp_path):
    (tmp_path / "corpus.txt").write_text("hello world\n" * 10)
    path = tmp_path / "p.plan"
    path.write_text(
        "model { layers = 1  hidden = 16  heads = 2  vocab = 256  seq_len = 8 }\n"
        'hardware { device = "cpu" }\ntrain { global_batch = 4  data = "corpus.txt" }\n'
    )
    plan = load_plan(path, strategies=load_registry())
    # Carried as written (so the compiled program works wherever the data root is), checked here.
    assert plan.train.data == "corpus.txt" and plan.data_root == str(tmp_path.resolve())


# -- which strategies `use` may name ------------------------------------------------------------


def test_registered_names_are_entry_point_names_restricted_by_env(monkeypatch):
    monkeypatch.delenv("PLANC_PLUGINS")
    everything = load_registry(refresh=True).registered
    assert {"ddp", "zero1", "fsdp"} <= everything
    monkeypatch.setenv("PLANC_PLUGINS", " ddp , fsdp,not-installed ")
    assert load_registry(refresh=True).registered == {"ddp", "fsdp"}
    monkeypatch.setenv("PLANC_PLUGINS", "  ")  # empty: no restriction
    assert load_registry(refresh=True).registered == everything


@pytest.mark.dist
def test_checking_does_not_import_plugins_or_torch():
    import subprocess
    import sys

    # The registry is loaded (the command hands it to the reader) but a plan without use blocks
    # never needs a strategy module: none is imported, built-in or plugin.
    code = (
        "import sys; from planc.cli import main; main(['check', 'plans/tiny-cpu.plan']); "
        "from planc.strategies.composition import BUILTIN_ORDER; "
        "strategies = {f'planc.strategies.{n}' for n in BUILTIN_ORDER} | {'planc_powersgd'}; "
        "bad = [m for m in sys.modules if m == 'torch' or any(m == s or m.startswith(s + '.') for s in strategies)]; "
        "print(bad)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=PLANS.parent,
        env={**os.environ, "PLANC_PLUGINS": ""},
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("[]"), result.stdout + result.stderr


@pytest.mark.dist
def test_a_plan_error_is_never_a_traceback_in_a_subprocess(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "bad.plan"
    path.write_text("model { layers = }\n")
    result = subprocess.run([sys.executable, "-m", "planc", "check", str(path)], capture_output=True, text=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"{path}:1:16: error: missing value after 'layers ='" in result.stderr


def test_a_missing_device_says_a_name_of_ones_own_is_allowed(tmp_path, capsys):
    """Without `device`, the hint names the presets and the keys a device of one's own needs."""
    path = tmp_path / "own.plan"
    path.write_text(
        'model { preset = "gpt2-small" }\n'
        "hardware { memory = 80 GB  peak = 989 TFLOPS  intra_node_bw = 450 GB/s  inter_node_bw = 50 GB/s }\n"
        "train { global_batch = 64 }\n"
    )
    code, _, err = run_cli(capsys, "check", str(path))
    assert code == 1 and "missing 'device'" in err
    assert "your own name given memory, peak, intra/inter_node_bw" in err
    path.write_text(path.read_text().replace("hardware {", 'hardware { device = "mygpu"'))
    assert run_cli(capsys, "check", str(path))[0] == 0
