"""The cost model against what planc's own program measured on GPUs.

``tests/data/gpu_measured.json`` holds ``planc verify``'s measurements of the 4-layer Llama 3 8B
plan on one H100 (third session; selective recomputation from the fifth) and one H200 (fourth
session; two of its plans deepened to 20 and 28 layers, which the model puts at 99% of the usable
memory), copied from
``docs/gpu-runs/`` (docs/gpu.md). They come from the devices, not from the code under test.
The bounds are looser than what the model scored when the measurements were taken (peaks within
1.1%, 0.4% since the final norm's and head's saved inputs are counted; steps within 7.6%) so that a
change of the model that moves a GPU prediction by more than the measurement allows fails here, on
CPU, where no GPU is at hand to run ``planc verify`` again.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from planc.dsl.load import load_plan_text
from planc.spec import Layout
from planc.strategies.registry import load_registry
from planc.verify.predicted import estimate_for, predicted_for_rank

ROOT = Path(__file__).resolve().parents[2]
MEASURED = json.loads((ROOT / "tests" / "data" / "gpu_measured.json").read_text())["cases"]
REGISTRY = load_registry()


def predicted(case: dict) -> dict:
    """The model's numbers for the case's plan: the repository's plan with the case's keys set."""
    text = (ROOT / case["plan"]).read_text()
    for key, value in case["changes"].items():
        text, count = re.subn(rf"(?m)^(\s*{key}\s*=\s*)\S+", rf"\g<1>{value}", text)
        assert count == 1, f"{case['plan']} has no single {key!r} line"
    plan = load_plan_text(text, f"{case['name']}.plan", strategies=REGISTRY)
    # One device: the layout the plan fixes (tp = pp = dp = 1).
    layout = Layout(
        tp=1, pp=1, dp=1, zero=0, recompute=plan.layout.recompute, schedule=None, micro_batch=plan.train.micro_batch
    )
    ctx, est = estimate_for(plan, layout, REGISTRY)
    return predicted_for_rank(ctx, est, 0)


@pytest.mark.parametrize("case", MEASURED, ids=[c["name"] for c in MEASURED])
def test_peak_within_2_percent_of_the_gpu(case):
    """``max_memory_allocated`` against the peak net of the CUDA context and the allocator margin
    (what ``planc verify`` compares on CUDA). An under-prediction is the error that OOMs a run the
    planner called a fit: the two 99% plans would need about 1.4 GiB more than the headroom holds
    for one to fail on an H200, so 2% is the bound both ways."""
    p = predicted(case)
    error = p["peak_net_bytes"] / case["measured"]["peak_allocated_bytes"] - 1.0
    assert abs(error) < 0.02, f"{case['name']}: peak {error:+.1%} against {case['source']}"


@pytest.mark.parametrize("case", MEASURED, ids=[c["name"] for c in MEASURED])
def test_reserved_memory_within_3_percent_of_the_prediction_with_its_margin(case):
    """The caching allocator's reserve (``max_memory_reserved``) against the prediction less the
    CUDA context, whose 5% allocator margin stands for fragmentation. Measured: 1.7-3.3% inside it
    without recomputation, 1.7% beyond it with full recomputation on the 4-layer plan (2.0 GiB
    reserved over 34.1 allocated, on both GPUs; 2.6 over 124.8 at 28 layers, inside), which the
    planner's default 5% headroom absorbs."""
    p = predicted(case)
    predicted_reserved = p["peak_bytes"] - p["context_bytes"]
    assert predicted_reserved >= case["measured"]["peak_reserved_bytes"] * 0.97, case["name"]


@pytest.mark.parametrize("case", MEASURED, ids=[c["name"] for c in MEASURED])
def test_step_time_within_10_percent_of_the_gpu(case):
    """The step on the device preset (no calibration) against the median timed step."""
    error = predicted(case)["step_s"] / case["measured"]["step_s_median"] - 1.0
    assert abs(error) < 0.10, f"{case['name']}: step {error:+.1%} against {case['source']}"


def test_a_small_models_step_is_the_hosts_not_the_kernels():
    """``plans/gpu/tiny-1xh100.plan`` (4 layers, hidden 256, 2 x 2,048 tokens per step) on one H100:
    29.9 ms per step, the median of steps 4-16 in ``metrics.jsonl`` of the fifth GPU session
    (docs/gpu-runs/2026-11-28-h100/b-tiny-straight.jsonl). Its kernels take about a millisecond; the
    step is the host queueing ~2,600 eager ops at ~12 us each. With no host cost on a GPU the model
    said 1.4 ms, 95% fast, inside a band of +-9%. Held to 20%: the op counts are planc's own program,
    counted on CPU, and the per-op cost is the measured hosts' (12 us; this one's was not measured)."""
    lines = (ROOT / "docs/gpu-runs/2026-11-28-h100/b-tiny-straight.jsonl").read_text().splitlines()
    rows = [row for row in map(json.loads, lines) if "step_s" in row]
    steps = sorted(row["step_s"] for row in rows[3:])
    median = steps[len(steps) // 2]
    assert 0.028 < median < 0.032  # the file is the one the docstring describes
    plan = load_plan_text((ROOT / "plans/gpu/tiny-1xh100.plan").read_text(), "tiny.plan", strategies=REGISTRY)
    layout = Layout(tp=1, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=plan.train.micro_batch)
    ctx, est = estimate_for(plan, layout, REGISTRY)
    assert abs(est.step_s / median - 1.0) < 0.20, f"{est.step_s * 1e3:.1f} ms against {median * 1e3:.1f} ms"


def test_explain_says_when_the_host_sets_the_step():
    """The tiny plan's blocks run ~1 ms of kernels behind ~30 ms of eager dispatch: its bottleneck is
    the host's, and explain says so; the 8B-shaped plan's kernels are ~50x its host time and its
    bottleneck stays plain compute."""
    from planc.explain.report import bottleneck

    words = {}
    for name in ("tiny-1xh100", "llama3-8b-4layers-1xh100"):
        plan = load_plan_text((ROOT / f"plans/gpu/{name}.plan").read_text(), f"{name}.plan", strategies=REGISTRY)
        layout = Layout(tp=1, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=plan.train.micro_batch)
        _, est = estimate_for(plan, layout, REGISTRY)
        words[name] = (est.host_bound, bottleneck(est, {}, plan.hardware))
    assert words["tiny-1xh100"][0] and "set by the host's eager dispatch" in words["tiny-1xh100"][1]
    assert not words["llama3-8b-4layers-1xh100"][0]
    assert words["llama3-8b-4layers-1xh100"][1].startswith("compute (")
