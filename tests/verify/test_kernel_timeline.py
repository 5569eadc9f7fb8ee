"""A profiled GPU step split into compute, exposed communication and idle time, on made-up kernels
(every expected number worked out by hand from the intervals)."""

from __future__ import annotations

import json

import pytest

from planc.verify.kernel_timeline import kernel_events, kernel_kind, step_split
from planc.verify.report import rows_for_rank

# (name, start, end) in seconds: two computing kernels overlapping on two streams, a collective that
# starts under the second and runs on alone, then nothing until the step ends at 25.
KERNELS = [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 0.0, 10.0),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", 5.0, 12.0),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 10.0, 20.0),
]


def test_kinds_of_the_kernels_an_h100_ran():
    assert kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26") == "attention"
    assert kernel_kind("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NTT") == "gemm"
    assert kernel_kind("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL") == "collective"
    assert kernel_kind("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>") == "loss"
    assert kernel_kind("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>") == "optimizer"


def test_the_step_splits_into_compute_exposed_communication_and_idle():
    split = step_split(KERNELS, wall_s=25.0)
    assert split["compute_s"] == pytest.approx(12.0)  # [0, 10] and [5, 12] counted once: [0, 12]
    assert split["communication_s"] == pytest.approx(10.0)
    assert split["communication_exposed_s"] == pytest.approx(8.0)  # [10, 12] hides under compute
    assert split["idle_s"] == pytest.approx(5.0)  # nothing runs in [20, 25]
    assert split["kernels_s"] == pytest.approx({"gemm": 10.0, "other": 7.0, "collective": 10.0})


def test_kernels_are_read_from_the_profilers_chrome_trace(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {"cat": "kernel", "name": "nvjet_x", "ts": 1_000_000, "dur": 250_000},
                    {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 999_000, "dur": 10},  # not a kernel
                    {"cat": "kernel", "name": "ncclDevKernel_y", "ts": 1_500_000, "dur": 500_000},
                ]
            }
        )
    )
    assert kernel_events(trace) == [("nvjet_x", 1.0, 1.25), ("ncclDevKernel_y", 1.5, 2.0)]


def test_verify_holds_the_split_against_the_models_parts():
    states = {"params": 1, "grads": 1, "optimizer": 2}
    measured = {"rank": 0, "model_states": states, "timeline": step_split(KERNELS, wall_s=25.0)}
    parts = {"compute": 9.0, "recompute": 1.0, "bubble": 2.0, "optimizer": 1.0, "TP exposed": 4.0, "DP exposed": 2.0}
    predicted = {"model_states": states, "comm": {}, "step_parts": parts}
    rows = {(r.section, r.name): r for r in rows_for_rank(measured, predicted)}
    assert rows[("step time", "compute kernels")].predicted == 11.0  # compute + recompute + optimizer
    assert rows[("step time", "compute kernels")].error == pytest.approx(11.0 / 12.0 - 1)
    assert rows[("step time", "communication exposed")].error == pytest.approx(6.0 / 8.0 - 1)
    assert rows[("step time", "device idle")].error == pytest.approx(2.0 / 5.0 - 1)  # the bubble, against 5


def test_without_a_bubble_idle_time_is_shown_as_a_share_of_the_step_not_an_error():
    """One H100 measured 14 ms of host-bound idle time in a 734 ms profiled step: against a predicted
    0 that read as -100%; the row says what share of the step it was and that it is not modelled."""
    states = {"params": 1, "grads": 1, "optimizer": 2}
    measured = {"rank": 0, "model_states": states, "timeline": step_split(KERNELS, wall_s=25.0)}
    predicted = {"model_states": states, "comm": {}, "step_parts": {"compute": 9.0, "optimizer": 1.0}}
    idle = {(r.section, r.name): r for r in rows_for_rank(measured, predicted)}[("step time", "device idle")]
    assert idle.predicted is None and idle.error is None and idle.measured == pytest.approx(5.0)
    assert "20.0% of the step" in idle.note and "not modelled" in idle.note  # 5 of the 25 s wall
