"""planc check reads the data files: ids beyond the vocabulary and byte text with vocab != 256 are
located errors; paths stay as written; eval keys need val_data; log names known sinks; --steps past
the schedule is defined."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from planc.cli import main
from planc.dsl import load_plan
from planc.errors import PlanError
from planc.spec.train import TrainSpec, steps_beyond_schedule
from planc.strategies.registry import load_registry


def write_plan(folder, train: str, vocab: int = 512) -> str:
    path = folder / "p.plan"
    path.write_text(
        f"model {{ layers = 2  hidden = 64  heads = 4  vocab = {vocab}  seq_len = 32 }}\n"
        'hardware { device = "cpu"  per_node = 2 }\n'
        f"train {{ global_batch = 4\n  {train}\n}}\n"
    )
    return str(path)


def check_error(path: str) -> str:
    with pytest.raises(PlanError) as failure:
        load_plan(path, strategies=load_registry())
    return str(failure.value)


def test_prepared_data_that_fits_passes_and_stays_relative(prepared, tmp_path):
    shutil.copytree(prepared, tmp_path / "tokens")
    plan = load_plan(
        write_plan(tmp_path, 'data = "tokens/train.bin"  val_data = "tokens/val.bin"'), strategies=load_registry()
    )
    assert (plan.train.data, plan.train.val_data) == ("tokens/train.bin", "tokens/val.bin")
    assert plan.data_root == str(tmp_path.resolve())


def test_ids_beyond_the_vocabulary_are_located_at_the_data_key(prepared, tmp_path):
    shutil.copytree(prepared, tmp_path / "tokens")
    message = check_error(write_plan(tmp_path, 'data = "tokens/train.bin"', vocab=256))
    # the sidecar records max_id 511 for a 512-token tokenizer
    assert "p.plan:4:10: error:" in message and "holds token id 511 (its sidecar records)" in message
    assert "model.vocab = 256" in message and "set vocab to the tokenizer's 512" in message


def test_a_headerless_file_is_scanned_for_its_largest_id(tmp_path):
    ids = np.arange(100, dtype=np.uint16)
    ids[40] = 9000
    ids.tofile(tmp_path / "train.bin")  # nanoGPT layout: no sidecar, nothing recorded
    message = check_error(write_plan(tmp_path, 'data = "train.bin"'))
    assert "holds token id 9000 (found by scanning it), but model.vocab = 512" in message


def test_a_file_too_large_to_scan_is_left_to_the_run(tmp_path, monkeypatch):
    import planc.data.check

    monkeypatch.setattr(planc.data.check, "SCAN_LIMIT", 10)  # bytes
    np.full(100, 9000, dtype=np.uint16).tofile(tmp_path / "train.bin")
    plan = load_plan(write_plan(tmp_path, 'data = "train.bin"'), strategies=load_registry())
    assert any("was not scanned; every batch's ids are checked" in note for note in plan.notes)


def test_byte_text_needs_a_byte_vocabulary(tmp_path):
    (tmp_path / "corpus.txt").write_text("some text " * 20)
    message = check_error(write_plan(tmp_path, 'data = "corpus.txt"', vocab=128_256))
    assert "p.plan:4:10: error: train.data = 'corpus.txt' is a text file, read as raw bytes" in message
    assert "needs model.vocab = 256, but vocab = 128256" in message and "planc prepare" in message
    assert (
        load_plan(write_plan(tmp_path, 'data = "corpus.txt"', vocab=256), strategies=load_registry()).train.data
        == "corpus.txt"
    )


def test_validation_data_from_another_tokenizer_is_refused(prepared, tmp_path):
    shutil.copytree(prepared, tmp_path / "tokens")
    sidecar = tmp_path / "tokens" / "val.bin.json"
    sidecar.write_text(json.dumps({**json.loads(sidecar.read_text()), "tokenizer": {"sha256": "0" * 64}}))
    message = check_error(write_plan(tmp_path, 'data = "tokens/train.bin"  val_data = "tokens/val.bin"'))
    assert "val.bin was tokenized with another tokenizer" in message


def test_missing_files_eval_keys_without_val_data_and_unknown_sinks(tmp_path):
    message = check_error(write_plan(tmp_path, 'data = "nope.bin"  eval_every = 5'))
    assert "data file not found" in message
    assert "eval_every is set, but there is no val_data" in message
    message = check_error(write_plan(tmp_path, "log = [wandb, tensorbord]"))
    assert "p.plan:4:9: error: unknown metrics sink 'tensorbord'" in message
    assert "did you mean 'tensorboard'?" in message


def test_a_directory_is_not_a_data_file(prepared, tmp_path):
    shutil.copytree(prepared, tmp_path / "tokens")
    assert "is a directory; name a file in it (it has train.bin, val.bin)" in check_error(
        write_plan(tmp_path, 'data = "tokens"')
    )


def test_steps_past_the_schedule():
    # The cosine decay ends at min_lr at train.steps: with min_lr = 0 more steps would change nothing.
    refusal, warning = steps_beyond_schedule(TrainSpec(global_batch=1, steps=100), 150)
    assert warning is None and "would not change the weights" in refusal
    refusal, warning = steps_beyond_schedule(TrainSpec(global_batch=1, steps=100, min_lr=1e-5), 150)
    assert refusal is None and "steps 101..150 train at the constant min_lr = 1e-05" in warning
    assert steps_beyond_schedule(TrainSpec(global_batch=1, steps=100), 100) == (None, None)


def test_planc_run_refuses_steps_past_a_finished_schedule_before_launching(tmp_path, capsys):
    plan = write_plan(tmp_path, "steps = 10")
    assert main(["run", plan, "--steps", "20", "--out", str(tmp_path / "run")]) == 1
    assert "--steps 20 goes beyond train.steps = 10" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert main(["run", plan, "--log", "tensorbord", "--out", str(tmp_path / "run")]) == 1
    assert "did you mean 'tensorboard'?" in capsys.readouterr().err


def test_planc_run_log_adds_sinks_to_the_plan_the_program_carries(tmp_path, capsys):
    plan = write_plan(tmp_path, "log = wandb  steps = 10")  # one name alone is a list of one
    assert main(["run", plan, "--print", "--log", "tensorboard", "--log", "wandb", "--out", str(tmp_path / "r")]) == 0
    recorded = json.loads((tmp_path / "r" / "plan.json").read_text())["plan"]["train"]["log"]
    assert recorded == ["wandb", "tensorboard"]  # the plan's first, each once
    assert "'log': ['wandb', 'tensorboard']" in (tmp_path / "r" / "train.py").read_text()
