"""metrics.jsonl: one flushed JSON object per step with the documented fields; rank 0 only."""

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from planc.runtime.metrics import MetricsLogger, format_progress, memory_label, peak_memory_bytes
from planc.spec import build_plan

FIELDS = {"step", "loss", "lr", "step_s", "tokens_per_s", "grad_norm", "memory_bytes"}


def test_each_step_is_a_flushed_json_line(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    out = io.StringIO()
    logger = MetricsLogger(path, tokens_per_step=4096, total_steps=3, stream=out)
    logger.log(1, loss=torch.tensor(2.5), lr=1e-3, step_s=0.5, grad_norm=torch.tensor(0.75))
    # Readable before close: a crash after this point loses nothing written.
    first = json.loads(path.read_text().splitlines()[0])
    assert FIELDS <= first.keys()
    assert first["step"] == 1 and first["loss"] == 2.5 and first["grad_norm"] == 0.75
    assert first["tokens_per_s"] == 4096 / 0.5  # tokens per step / seconds per step
    assert first["memory_bytes"] > 0
    logger.log(2, loss=float("nan"), lr=1e-3, step_s=0.25, extra_field=7)
    logger.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    assert lines[1]["loss"] == "nan" and lines[1]["extra_field"] == 7
    assert "step 1/3 | loss 2.5000 | lr 1.00e-03 | 8.2 k tok/s | 0.500 s/step" in out.getvalue()


def test_resumed_run_appends(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for step in (1, 2):
        with MetricsLogger(path, tokens_per_step=1, stream=io.StringIO()) as logger:
            logger.log(step, loss=1.0, lr=0.1, step_s=1.0)
    assert len(path.read_text().splitlines()) == 2


def test_other_ranks_write_and_print_nothing(tmp_path):
    out = io.StringIO()
    logger = MetricsLogger(tmp_path / "m.jsonl", tokens_per_step=1, rank=1, stream=out)
    assert logger.log(1, loss=1.0, lr=0.1, step_s=1.0) is None
    assert not (tmp_path / "m.jsonl").exists() and out.getvalue() == ""


def test_progress_every_n_steps_and_last(tmp_path):
    out = io.StringIO()
    logger = MetricsLogger(None, tokens_per_step=1, total_steps=5, print_every=2, stream=out)
    for step in range(1, 6):
        logger.log(step, loss=1.0, lr=0.1, step_s=1.0, memory_bytes=3 * 1024**3)
    printed = [line.split(" |")[0] for line in out.getvalue().splitlines()]
    assert printed == ["step 2/5", "step 4/5", "step 5/5"]
    assert "rss 3.00 GiB" in out.getvalue()  # on CPU: the process's resident set, not the tensors


def test_the_progress_line_names_which_memory_it_shows():
    """Review finding 5: on CPU the peak is the process's resident set, a different quantity from the
    predicted memory; the progress line called it "mem" as it does CUDA's max_memory_allocated."""
    record = {"step": 1, "loss": 1.0, "lr": 0.1, "step_s": 2.0, "memory_bytes": 3 * 1024**3}
    assert (memory_label("cpu"), memory_label(None), memory_label("cuda:0")) == ("rss", "rss", "mem")
    assert "| rss 3.00 GiB" in format_progress(record, memory=memory_label("cpu"))


def test_peak_memory_grows_with_a_large_allocation():
    before = peak_memory_bytes()
    block = torch.ones(64 * 1024 * 1024 // 4)  # 64 MiB, touched
    assert peak_memory_bytes() >= before
    assert peak_memory_bytes() >= block.numel() * 4
    assert format_progress({"step": 1, "loss": 1.0, "lr": 0.1, "step_s": 2.0, "memory_bytes": 0}).startswith("step 1 |")


def test_the_progress_line_carries_the_predicted_step_times_band():
    """explain prints "step 380 ms ±9%"; the progress line beside the measured step said only
    "(pred 0.380)", so a 0.412 s step 8% over read as a miss. The band comes from the program's
    PREDICTED["step_uncertainty"] (relative; None: uncalibrated), printed as explain prints it."""
    record = {"step": 1, "loss": 1.0, "lr": 0.1, "step_s": 0.412, "memory_bytes": 0, "predicted_step_s": 0.38}
    assert "| 0.412 s/step (pred 0.380 ±9%) |" in format_progress(record, predicted={"step_uncertainty": 0.09})
    uncalibrated = format_progress(record, predicted={"step_uncertainty": None})
    assert "| 0.412 s/step (pred 0.380, uncalibrated) |" in uncalibrated
    assert "| 0.412 s/step (pred 0.380) |" in format_progress(record)  # a program from before the band
    out = io.StringIO()
    logger = MetricsLogger(None, tokens_per_step=1, stream=out, predicted={"step_s": 0.38, "step_uncertainty": 0.094})
    logger.log(1, loss=1.0, lr=0.1, step_s=0.412, memory_bytes=0, predicted_step_s=0.38)
    assert "(pred 0.380 ±9%)" in out.getvalue()  # 0.094 to whole percent, as explain rounds it


def test_the_progress_lines_band_is_the_predictions_number_not_its_words():
    """The band was parsed out of explain's words in PREDICTED["step_band"]: words that changed
    ("±9 % (from 12 runs)", "not calibrated") printed a wrong or mangled band. The number decides;
    the words are for people and are never read."""
    record = {"step": 1, "loss": 1.0, "lr": 0.1, "step_s": 0.412, "memory_bytes": 0, "predicted_step_s": 0.38}
    reworded = {"step_band": "±9 % (from 12 runs)", "step_uncertainty": 0.09}
    assert "| 0.412 s/step (pred 0.380 ±9%) |" in format_progress(record, predicted=reworded)
    reworded = {"step_band": "not calibrated", "step_uncertainty": None}
    assert "| 0.412 s/step (pred 0.380, uncalibrated) |" in format_progress(record, predicted=reworded)
    # words alone (a program emitted before the number) give no band rather than a guessed one
    assert "| 0.412 s/step (pred 0.380) |" in format_progress(record, predicted={"step_band": "±9%"})


def test_steps_before_a_strategy_works_as_priced_say_from_when_the_prediction_holds():
    """PowerSGD all-reduces uncompressed for its first start_iter steps; the program's PREDICTED is
    the compressing step (its ``steady_after``: 10). Those first steps are not held against it: their
    record and progress line say from which step the prediction holds; from step 11 they carry it."""
    from planc.runtime.utilisation import Utilisation

    plan = build_plan(
        {
            "model": {"layers": 1, "hidden": 32, "heads": 4, "vocab": 256, "seq_len": 16},
            "hardware": {"device": "cpu", "per_node": 2},
            "train": {"global_batch": 4},
        }
    )
    utilisation = Utilisation(plan, {"step_s": 0.38, "step_uncertainty": 0.09, "steady_after": 10})
    early, late = utilisation.fields(0.2, 10), utilisation.fields(0.4, 11)
    assert early["predicted_from_step"] == 11 and "predicted_step_s" not in early
    assert late["predicted_step_s"] == 0.38 and "predicted_from_step" not in late
    record = {"step": 10, "loss": 1.0, "lr": 0.1, "step_s": 0.2, "memory_bytes": 0, **early}
    assert "| 0.200 s/step (pred from step 11) |" in format_progress(record, predicted={"step_uncertainty": 0.09})
    # A program without such a strategy (no "steady_after") carries the prediction from the first step.
    assert Utilisation(plan, {"step_s": 0.38}).fields(0.2, 1)["predicted_step_s"] == 0.38


TRAIN_ONE_STEP = """
import json, sys
from planc.runtime.compose import compose
from planc.runtime.loop import shutdown, train
from planc.spec import Layout, Plan
from planc.strategies.registry import load_registry
plan = Plan.model_validate(json.loads(sys.argv[1]))
job = compose(plan, Layout(tp=1, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=4), load_registry())
try:
    train(job, steps=1, predicted={"memory_bytes": 1, "capacity_bytes": 2, "step_s": 0.38, "step_uncertainty": 0.09})
finally:
    shutdown()
"""


@pytest.mark.dist  # starts a training process
def test_the_training_loop_prints_the_band_of_the_programs_prediction():
    """The band reaches the progress line from the program's PREDICTED, the dict its start-up line
    ("predicted: ...; step 0.38 s ±9%") is printed from."""
    model = {"layers": 1, "hidden": 32, "heads": 4, "vocab": 256, "seq_len": 16}
    plan = build_plan({"model": model, "hardware": {"device": "cpu", "per_node": 1}, "train": {"global_batch": 4}})
    done = subprocess.run(
        [sys.executable, "-c", TRAIN_ONE_STEP, plan.model_dump_json()], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "s/step (pred 0.380 ±9%) |" in done.stdout


def test_a_cuda_step_peak_starts_at_the_step(monkeypatch):
    """On CUDA the peak counter is reset for the device the step runs on; on CPU (RSS) nothing is."""
    from planc.runtime import metrics

    resets = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: resets.append(device))
    metrics.reset_peak_memory(torch.device("cpu"))
    metrics.reset_peak_memory(torch.device("cuda", 5))
    assert resets == [torch.device("cuda", 5)]


def logged_memory_of_two_ranks(payload: dict) -> dict[str, list]:
    """On each of 2 gloo ranks (tests/ranks.py): rank 1 reports a made-up peak of 1 TiB + the number
    of peak resets so far; rank 0 its real RSS (far less). The loop must log the larger, read after
    that step's reset. Trained twice from the same start: with the step's numbers in one
    all-gather (2 ranks, below ``GATHER_RANKS``), then in the two all-reduces of larger worlds."""
    import torch.distributed as dist

    from planc.runtime import metrics, step_summary
    from planc.runtime.compose import compose
    from planc.runtime.loop import train
    from planc.spec import Layout, Plan
    from planc.strategies.registry import load_registry

    if dist.get_rank() == 1:
        resets = []
        metrics.reset_peak_memory = lambda device: resets.append(device)
        metrics.peak_memory_bytes = lambda device=None: (1 << 40) + len(resets)
    plan = Plan.from_json(payload["plan"])
    layout = Layout(tp=1, pp=1, dp=2, zero=0, recompute="none", schedule=None, micro_batch=2)
    logged: dict[str, list] = {}
    for path, gather_ranks in (("gathered", 64), ("all-reduced", 1)):
        step_summary.GATHER_RANKS = gather_ranks
        out = Path(payload["out"]) / path
        train(compose(plan, layout, load_registry()), out_dir=out, quiet=True)
        if dist.get_rank() == 0:
            records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            logged[path] = [(r["memory_bytes"], r["loss"]) for r in records]
    return logged


@pytest.mark.dist
def test_logged_memory_is_each_steps_largest_peak_over_ranks(tmp_path):
    from ranks import run_ranks

    plan = build_plan(
        {
            "model": dict(layers=1, hidden=16, heads=2, vocab=32, seq_len=8),
            "hardware": {"device": "cpu"},
            "train": dict(global_batch=4, micro_batch=2, lr=1e-3, warmup_steps=1, steps=2, precision="fp32"),
        }
    )
    payload = {"plan": plan.to_json(), "out": str(tmp_path / "run")}
    logged = run_ranks("tests/runtime/test_metrics.py:logged_memory_of_two_ranks", 2, payload)
    # Rank 1's fake peak after the reset of step 1, then of step 2 (3 and 4 in the second run);
    # rank 0's RSS is far below 1 TiB.
    assert [memory for memory, _ in logged["gathered"]] == [(1 << 40) + 1, (1 << 40) + 2]
    assert [memory for memory, _ in logged["all-reduced"]] == [(1 << 40) + 3, (1 << 40) + 4]
    # The same training both times: the same global mean loss, however it travelled.
    assert [loss for _, loss in logged["gathered"]] == [loss for _, loss in logged["all-reduced"]]
