"""The activation bytes the runtime really keeps for backward, against the cost model.

``bench/activation_memory.py`` builds planc's model with the real ``tensor_parallel`` and
``recompute`` strategies, runs one forward and weighs every storage still alive afterwards
(parameters excluded): that is what autograd and activation checkpointing kept. The cost model's
:func:`planc.cost.memory.layer_activation_bytes` must predict it per block for every family,
precision and recompute mode -- a planner that under-counts activations picks layouts that OOM.
"""

import pytest
from bench_scripts import load_bench

bench = load_bench("activation_memory")


def check(results):
    by_case = {}
    for r in results:
        # per-row statistics are the only approximation (8 bytes per row and norm); at h = 64 they
        # are 3% of a block, so 1% is tight enough to catch any missing tensor
        assert r["measured"] == pytest.approx(r["predicted"], rel=0.01), r
        by_case.setdefault((r["family"], r["precision"], r["tp"], r["sp"]), {})[r["mode"]] = r
    for case, modes in by_case.items():
        none, selective, full = modes["none"], modes["selective"], modes["full"]
        # each mode keeps less than the one before: selective must never cost more than none
        assert full["measured"] < selective["measured"] < none["measured"], case
        # selective reruns exactly one matmul per block (the attention-out projection, whose output
        # it does not keep) and no attention; no reducing collective, but under SP the two
        # all-gathers of the sub-layer inputs (Korthikanti et al. 2022, Sec. 4.2.2: keep the 1/t
        # shard, gather it again in backward) -- 1 block here
        sel_ops, none_ops = selective["backward_ops"], none["backward_ops"]
        assert sel_ops.get("matmul", 0) == none_ops.get("matmul", 0) + 1, case
        assert sel_ops.get("attention", 0) == 0, case
        regathers = 2 if case[3] else 0
        assert sel_ops.get("collective", 0) == none_ops.get("collective", 0) + regathers, case


#: One case stays in the quick suite; the other five are as slow as a launch (the slow half), but
#: start no process, so they run beside the launches rather than in their queue.
SINGLE_PROCESS = [
    pytest.param(family, label, marks=() if (family, label) == ("gpt", "fp32") else pytest.mark.dist(launches=False))
    for family in bench.FAMILIES
    for label, _, _ in bench.PRECISIONS
]


@pytest.mark.parametrize("family, precision", SINGLE_PROCESS)
def test_one_process_gpt_and_llama_in_fp32_autocast_and_bf16_parameters(family, precision):
    precisions = [p for p in bench.PRECISIONS if p[0] == precision]
    check(bench.run_cases(bench.single_process_cases(families=(family,), precisions=precisions)))


@pytest.mark.dist
def test_tensor_and_sequence_parallel_on_two_processes():
    """Each family and each precision under TP and TP + SP, not every pairing (the single-process
    cases above pair them all; `python bench/activation_memory.py` runs every pairing under TP too):
    half the launch's cases, which CI's 15 minutes on 2 cores need."""
    pairs = [("gpt", "fp32"), ("llama", "bf16 autocast")]
    results = bench.launch_tp(pairs=[list(p) for p in pairs])
    assert {(r["family"], r["precision"], r["sp"]) for r in results} == {
        (f, p, sp) for f, p in pairs for sp in (False, True)
    }
    check(results)
