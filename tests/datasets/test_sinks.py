"""Metrics sinks: TensorBoard and W&B (offline) write what they are given; plugins come through entry
points, and a broken one is reported and dropped while the others go on. MFU and the progress line."""

from __future__ import annotations

import io
import sys
import types
from importlib.metadata import EntryPoint

import pytest

import planc.runtime.sinks as sinks_module
from planc.runtime.metrics import format_progress
from planc.runtime.sinks import SinkRun, Sinks, known_sink_names
from planc.runtime.utilisation import Utilisation
from planc.spec import build_plan

RECORDS = [
    {"step": 1, "loss": 5.5, "lr": 1e-3, "step_s": 0.5, "grad_norm": 1.0, "note": "text is not logged"},
    {"step": 2, "loss": 5.25, "val_loss": 5.375, "lr": 2e-3, "step_s": 0.25, "grad_norm": 0.5},
]


def run_info(tmp_path, start=0) -> SinkRun:
    return SinkRun(out_dir=tmp_path, name="run", start_step=start, config={"plan": {"model": {"layers": 2}}})


def read_scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """TensorBoard's own reader (the one its dashboard uses)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_sink_writes_scalars_tensorboard_reads_back(tmp_path):
    with Sinks(["tensorboard"], run_info(tmp_path)) as sinks:
        for record in RECORDS:
            sinks.log(record)
    scalars = read_scalars(tmp_path / "tensorboard")
    assert scalars["train/loss"] == [(1, 5.5), (2, 5.25)]
    assert scalars["val/loss"] == [(2, 5.375)]
    assert scalars["perf/step_s"] == [(1, 0.5), (2, 0.25)]
    assert "note" not in scalars


@pytest.mark.dist  # the W&B SDK starts its own service process
def test_wandb_sink_logs_offline_into_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with Sinks(["wandb"], run_info(tmp_path), stream=io.StringIO()) as sinks:
        assert list(sinks.open) == ["wandb"]
        sinks.log({"step": 3, "loss": 4.125, "val_loss": 4.3203125, "lr": 1e-3})
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    history = run_file.read_bytes()  # protobuf records: the keys and the values' JSON text are in it
    assert b"val_loss" in history and b"4.3203125" in history and b"4.125" in history


class Recorder:
    """A well-behaved plugin sink."""

    seen: list = []

    def __init__(self, run: SinkRun):
        self.run = run

    def log(self, record):
        Recorder.seen.append(record["step"])

    def close(self):
        Recorder.seen.append("closed")


class FailsAtStepTwo(Recorder):
    def log(self, record):
        if record["step"] == 2:
            raise RuntimeError("server went away")
        super().log(record)


@pytest.fixture
def plugins(monkeypatch):
    module = types.ModuleType("fake_sinks")
    module.Recorder, module.FailsAtStepTwo = Recorder, FailsAtStepTwo
    monkeypatch.setitem(sys.modules, "fake_sinks", module)
    points = [
        EntryPoint("recorder", "fake_sinks:Recorder", sinks_module.ENTRY_POINT_GROUP),
        EntryPoint("flaky", "fake_sinks:FailsAtStepTwo", sinks_module.ENTRY_POINT_GROUP),
        EntryPoint("broken", "no_such_module_xyz:Sink", sinks_module.ENTRY_POINT_GROUP),
        EntryPoint("wandb", "fake_sinks:Recorder", sinks_module.ENTRY_POINT_GROUP),  # a built-in's name
    ]
    monkeypatch.setattr(sinks_module, "entry_points", lambda group: [p for p in points if p.group == group])
    Recorder.seen = []


def test_plugins_are_found_by_entry_point_and_failures_are_reported_and_dropped(plugins, tmp_path):
    assert known_sink_names() == ["tensorboard", "wandb", "broken", "flaky", "recorder"]
    report = io.StringIO()
    with Sinks(["recorder", "broken", "flaky"], run_info(tmp_path), stream=report) as sinks:
        assert list(sinks.open) == ["recorder", "flaky"]
        for step in (1, 2, 3):
            sinks.log({"step": step, "loss": 1.0})
        assert list(sinks.open) == ["recorder"]
    text = report.getvalue()
    assert "metrics sink 'broken' could not start, skipped: ModuleNotFoundError" in text
    assert "metrics sink 'flaky' failed at step 2, skipped: RuntimeError: server went away" in text
    # In order: both log step 1; recorder logs 2, flaky fails and is closed; recorder logs 3; recorder closes.
    assert Recorder.seen == [1, 1, 2, "closed", 3, "closed"]


def test_mfu_is_model_flops_over_peak_at_the_measured_and_predicted_times():
    plan = build_plan(
        {
            "model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "vocab_multiple": 64, "seq_len": 32},
            "hardware": {"device": "cpu", "per_node": 2},
            "train": {"global_batch": 8, "precision": "fp32"},
        }
    )
    # Per token, forward: blocks 2 x 12 h^2 weights x 2 FLOPs + attention 4 s h; head 2 h V.
    h, s, v, layers = 64, 32, 512, 2
    forward = layers * (2 * 12 * h * h + 4 * s * h) + 2 * h * v
    flops = 3 * forward * 8 * s  # training = 3 x forward, 8 sequences of 32 tokens
    peak = plan.hardware.peak_fp32 * 2  # fp32 peak of 2 processes
    fields = Utilisation(plan, {"step_s": 0.05}).fields(0.1)
    assert fields["mfu"] == pytest.approx(flops / (0.1 * peak))
    assert fields["predicted_mfu"] == pytest.approx(flops / (0.05 * peak)) and fields["predicted_step_s"] == 0.05


def test_progress_line_shows_validation_prediction_elapsed_and_time_left():
    record = {
        "step": 30,
        "loss": 4.9399,
        "val_loss": 4.96,
        "lr": 9.06e-4,
        "tokens_per_s": 42200.0,
        "step_s": 0.024,
        "predicted_step_s": 0.014,
        "mfu": 0.218,
        "predicted_mfu": 0.385,
        "grad_norm": 0.739,
        "memory_bytes": 0.35 * 2**30,
        "elapsed_s": 65.0,
    }
    assert format_progress(record, 40, eta_s=3725) == (
        "step 30/40 | loss 4.9399 | val 4.9600 | lr 9.06e-04 | 42.2 k tok/s | 0.024 s/step (pred 0.014) | "
        "mfu 21.8% (pred 38.5%) | grad 0.739 | mem 0.35 GiB | 1:05 elapsed, 1:02:05 left"
    )
