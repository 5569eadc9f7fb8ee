"""The single-process reference trainer: it learns, and gradient accumulation is exact."""

import math

import pytest

from planc.runtime.data import BRANCHING
from planc.runtime.reference import main, train_reference
from planc.spec import build_plan

TINY = dict(layers=2, hidden=64, heads=4, vocab=128, seq_len=32, vocab_multiple=1)


def tiny_plan(**train):
    base = dict(global_batch=16, lr=3e-3, warmup_steps=2, steps=20, precision="fp32")
    return build_plan({"model": TINY, "hardware": {"device": "cpu"}, "train": base | train})


def test_loss_falls_on_synthetic_data():
    run = train_reference(tiny_plan())
    assert len(run.losses) == 20
    # Untrained: about ln(vocab) = ln 128 = 4.85; the chain's own entropy is ln 4 = 1.39. Learning the
    # successor table must take a clear bite out of that gap within 20 steps.
    assert abs(run.losses[0] - math.log(128)) < 0.1
    assert sum(run.losses[-3:]) / 3 < math.log(128) - 0.5
    assert min(run.losses) > math.log(BRANCHING) - 0.1
    assert run.lrs[0] == pytest.approx(3e-3 / 2) and run.lrs[1] == pytest.approx(3e-3)  # warmup 2


def test_gradient_accumulation_equals_one_big_batch():
    plan = tiny_plan(steps=4)
    whole = train_reference(plan, micro_batch=16)
    accumulated = train_reference(plan, micro_batch=4)  # k = 4 micro-batches, each loss / 4
    for a, b in zip(whole.losses, accumulated.losses):
        assert abs(a - b) < 1e-6
    for a, b in zip(whole.grad_norms, accumulated.grad_norms):
        assert abs(a - b) < 1e-6 * max(1.0, a)


def test_bf16_autocast_tracks_fp32():
    fp32 = train_reference(tiny_plan(steps=5))
    bf16 = train_reference(tiny_plan(steps=5, precision="bf16"))
    # bf16 keeps 8 bits of mantissa (relative error 2^-8 = 0.4%); the losses agree to about that.
    for a, b in zip(fp32.losses, bf16.losses):
        assert abs(a - b) < 0.02 * a
    assert fp32.losses != bf16.losses  # autocast really ran in bf16


def test_bf16_weights_track_fp32_and_differ_from_autocast():
    """bf16 copies of the parameters (FSDP2's policy): the whole forward in bf16, not only the
    matmuls, so the trajectory differs from autocast's; masters and gradients stay fp32."""
    fp32 = train_reference(tiny_plan(steps=5))
    autocast = train_reference(tiny_plan(steps=5, precision="bf16"))
    weights = train_reference(tiny_plan(steps=5, precision="bf16"), bf16_weights=True, micro_batch=8)
    for a, b in zip(fp32.losses, weights.losses):
        assert abs(a - b) < 0.02 * a
    assert weights.losses != autocast.losses
    assert train_reference(tiny_plan(steps=5), bf16_weights=True).losses == fp32.losses  # fp32 plans ignore it


def test_command_line_prints_losses(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(tiny_plan(steps=3).to_json())
    assert main([str(path), "--steps", "2", "--micro-batch", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [["step", "1"], ["step", "2"]]
    assert float(lines[0].split()[-1]) == pytest.approx(
        train_reference(tiny_plan(steps=3), steps=1).losses[0], abs=1e-6
    )


def test_command_line_reports_a_bad_plan(tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text('{"model": 1}')
    assert main([str(path)]) == 2
    assert "not a valid plan.json" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.json")]) == 2
