"""The third-party PowerSGD plugin (plugins/planc-powersgd): registered, checked and costed like a built-in."""

from __future__ import annotations

import json
import math
from importlib.util import find_spec
from pathlib import Path

import pytest

if find_spec("planc_powersgd") is None:
    pytest.skip("planc-powersgd is not installed (pip install -e plugins/planc-powersgd)", allow_module_level=True)

from planc_powersgd.compression import gradient_shapes, matrix_elements, traffic_ratio  # noqa: E402

from planc.cli import main  # noqa: E402
from planc.cost.driver import evaluate  # noqa: E402
from planc.spec import Layout, build_plan  # noqa: E402
from planc.spec.issues import SpecError  # noqa: E402
from planc.strategies.registry import load_registry  # noqa: E402
from planc.units import format_bytes  # noqa: E402


def plan(uses=(), **model):
    spec = {"layers": 4, "hidden": 256, "heads": 8, "vocab": 1000, "seq_len": 128, **model}
    return build_plan(
        {
            "model": spec,
            "hardware": {"device": "A100-80GB", "per_node": 8},
            "train": {"global_batch": 64},
            "uses": [{"name": n, "options": o} for n, o in uses],
        }
    )


def layout(**fields):
    values = dict(tp=1, pp=1, dp=8, zero=0, recompute="none", schedule=None, micro_batch=8)
    values.update(fields)
    return Layout(**values)


def test_registered_from_its_own_distribution():
    strategy = load_registry(refresh=True).strategies["powersgd"]
    assert (strategy.distribution, strategy.version, strategy.builtin) == ("planc-powersgd", "0.1.0", False)
    assert strategy.after == ("ddp", "zero1")


def test_active_only_when_used_and_after_ddp():
    reg = load_registry()
    assert [s.name for s in reg.active(plan(), layout())] == ["bf16", "ddp"]
    used = plan(uses=[("powersgd", {"rank": 2})])
    assert [s.name for s in reg.active(used, layout())] == ["bf16", "ddp", "powersgd"]
    assert reg.strategies["powersgd"].options_for(used, layout()).rank == 2


@pytest.mark.parametrize(
    "options, message", [({"rank": 0}, "rank"), ({"start_iter": 1}, "start_iter"), ({"rnak": 2}, "did you mean 'rank'")]
)
def test_options_are_validated(options, message):
    with pytest.raises(SpecError) as info:
        load_registry().strategies["powersgd"].options_for(plan(uses=[("powersgd", options)]))
    assert message in str(info.value.issues[0])


def test_check_rejects_fsdp_and_single_rank():
    reg = load_registry()
    used = plan(uses=[("powersgd", {})])
    assert any("FSDP" in i.message for i in reg.check(used, layout(zero=3)))
    assert any("dp > 1" in i.message for i in reg.check(used, layout(dp=1, tp=8)))
    # bf16 DDP runs FSDP2's replicate, which takes no DDP communication hook: say how to keep DDP.
    assert any("bf16_weights = false" in i.message for i in reg.check(used, layout()))
    assert not reg.check(plan(uses=[("powersgd", {}), ("ddp", {"bf16_weights": False})]), layout())
    assert not reg.check(used, layout(zero=1))


def test_matrix_compression_by_hand():
    # 1024 x 1024 at rank 4: (1024 + 1024) * 4 = 8192 elements instead of 1,048,576.
    assert matrix_elements(1024, 1024, 4, 2.0) == (1_048_576, 8192)
    # 8 x 8 at rank 4: (8 + 8) * 4 = 64, and 64 * 2 >= 64: not worth it, sent whole.
    assert matrix_elements(8, 8, 4, 2.0) == (64, 64)
    # 3 x 100: the rank is capped at 3, (103) * 3 = 309, 309 * 2 = 618 >= 300: sent whole.
    assert matrix_elements(3, 100, 4, 2.0) == (300, 300)


@pytest.mark.parametrize(
    "model", [{}, {"mlp": "swiglu", "norm": "rmsnorm", "position": "rope", "kv_heads": 2}, {"tie_embeddings": True}]
)
def test_gradient_shapes_cover_every_parameter(model):
    spec = plan(**model).model
    assert sum(math.prod(shape) for shape in gradient_shapes(spec, tp=1)) == spec.params


def test_traffic_ratio_by_hand():
    spec = plan().model  # h 256, ffn 1024, vocab padded 1024, seq 128, gelu with biases, layernorm
    # rank 4, per block: wq/wk/wv/wo 256x256 -> 512*4 = 2048 each; w1 1024x256, w2 256x1024 -> 1280*4 = 5120
    # each; 1-D: 2 layernorms x 2 x 256 + biases 256*4 + 1024 + 256 = 3328. Per block 8192 + 10240 + 3328.
    # Embedding and output 1024x256 -> 5120 each; positions 128x256 -> 384*4 = 1536; final norm 512.
    compressed = 4 * (8192 + 10240 + 3328) + 2 * 5120 + 1536 + 512
    assert traffic_ratio(spec, tp=1, rank=4) == pytest.approx(compressed / spec.params)


def test_cost_pass_scales_data_parallel_traffic():
    lay = layout()
    plain_plan, used_plan = plan(), plan(uses=[("powersgd", {"rank": 4})])
    plain = evaluate(plain_plan, lay, load_registry().passes(plain_plan, lay))
    compressed = evaluate(used_plan, lay, load_registry().passes(used_plan, lay))
    ratio = traffic_ratio(plan().model, tp=1, rank=4)
    assert compressed.comm_of("dp").volume == pytest.approx(plain.comm_of("dp").volume * ratio)
    assert compressed.comm_of("dp").total < plain.comm_of("dp").total
    # Error feedback: one fp32 residual per gradient element on every rank.
    for before, after in zip(plain.stages, compressed.stages):
        terms = {t.name: t.value for t in after.transient}
        assert terms["PowerSGD error feedback"] == pytest.approx(before.grads)
        assert after.transient_bytes > before.transient_bytes


def test_the_last_buckets_p_and_q_all_reduces_are_on_the_critical_path():
    """Two more all-reduce rounds after backward, each of half the last bucket's compressed bytes:
    this model's fp32 gradients (4 bytes x its parameters) fit one 25 MiB bucket."""
    from planc.cost.comm import all_reduce_seconds
    from planc.cost.context import build_context

    lay = layout()
    used_plan = plan(uses=[("powersgd", {"rank": 4})])
    estimate = evaluate(used_plan, lay, load_registry().passes(used_plan, lay))
    ratio = traffic_ratio(used_plan.model, tp=1, rank=4)
    gradient_bytes = 4 * used_plan.model.params
    assert gradient_bytes < 25 * 2**20
    link = build_context(used_plan, lay).links["dp"]
    expected = 2 * all_reduce_seconds(gradient_bytes * ratio / 2, link)
    assert estimate.step_parts()["PowerSGD: the last bucket's P and Q all-reduces, chained"] == pytest.approx(expected)


def test_under_zero1_the_gradient_all_reduce_is_compressed_not_the_broadcast():
    """ZeRO-1 runs DDP for its gradients, so the hook compresses them (the equivalence case
    powersgd-zero1-compressing leaves the reference after start_iter, as the DDP one does); the
    parameter broadcast after ZeroRedundancyOptimizer's step is not DDP's and stays whole.

    bf16 under ZeRO-1 is autocast over fp32 parameters: gradients and broadcast parameters are
    4 bytes each. Plain: 7/8 x (2 x 4 Psi + 4 Psi) (zero1's pass); with PowerSGD the all-reduce's
    2 x 4 Psi shrinks by the traffic ratio: 7/8 x (2 x 4 Psi x ratio + 4 Psi)."""
    lay = layout(zero=1)
    plain_plan, used_plan = plan(), plan(uses=[("powersgd", {"rank": 4})])
    plain = evaluate(plain_plan, lay, load_registry().passes(plain_plan, lay)).comm_of("dp")
    compressed = evaluate(used_plan, lay, load_registry().passes(used_plan, lay)).comm_of("dp")
    psi, ratio = used_plan.model.params, traffic_ratio(used_plan.model, tp=1, rank=4)
    assert plain.volume == pytest.approx(7 / 8 * (2 * 4 * psi + 4 * psi))
    assert compressed.volume == pytest.approx(7 / 8 * (2 * 4 * psi * ratio + 4 * psi))
    assert compressed.total < plain.total and compressed.exposed < plain.exposed
    assert compressed.detail.startswith("PowerSGD rank 4: all-reduce of ")
    assert f"for {format_bytes(4 * psi)} fp32 gradients (x {ratio:.3f}) + broadcast of updated parameters" in (
        compressed.detail
    )


def test_under_ddp_the_detail_names_the_compressed_traffic():
    """The detail said "all-reduce of 1.32 GiB fp32 gradients" beside a volume of 17 MiB."""
    lay = layout()
    used_plan = plan(uses=[("ddp", {"bf16_weights": False}), ("powersgd", {"rank": 4})])
    estimate = evaluate(used_plan, lay, load_registry().passes(used_plan, lay))
    ratio = traffic_ratio(used_plan.model, tp=1, rank=4)
    detail = estimate.comm_of("dp").detail
    assert detail.startswith("PowerSGD rank 4: all-reduce of ") and f"fp32 gradients (x {ratio:.3f})" in detail


def test_the_compute_that_overlapped_traffic_slows_shrinks_with_it():
    """The contention term is proportional to the all-reduce time hidden behind backward, which
    PowerSGD scales by its ratio (planc.cost.data_parallel.with_contention)."""
    from planc.cost.data_parallel import CONTENTION

    lay = layout(zero=1)
    shape = {"layers": 24, "hidden": 1024, "heads": 16, "seq_len": 1024}  # a backward long enough to hide traffic
    plain_plan, used_plan = plan(**shape), plan(uses=[("powersgd", {"rank": 4})], **shape)
    plain = evaluate(plain_plan, lay, load_registry().passes(plain_plan, lay)).step_parts()
    used = evaluate(used_plan, lay, load_registry().passes(used_plan, lay)).step_parts()
    ratio = traffic_ratio(used_plan.model, tp=1, rank=4)
    assert plain[CONTENTION] > 0
    assert used[CONTENTION] == pytest.approx(plain[CONTENTION] * ratio)


POWERSGD_PLAN = Path(__file__).resolve().parents[1] / "codegen" / "data" / "powersgd.plan"  # 2 CPU processes
#: explain's plugins line for that plan: its one third-party strategy, named by its use block.
TAKES_PART = "powersgd (planc-powersgd 0.1.0)"
STATES = ("params", "grads", "optimizer")


def test_run_names_the_plugins_taking_part_as_explain_does(tmp_path, capsys):
    assert main(["explain", str(POWERSGD_PLAN)]) == 0
    assert f"  plugins   {TAKES_PART}\n" in capsys.readouterr().out
    assert main(["run", str(POWERSGD_PLAN), "--out", str(tmp_path / "run"), "--print"]) == 0
    err = capsys.readouterr().err.splitlines()
    layout_line = next(i for i, line in enumerate(err) if line.startswith("planc: tiny-powersgd · "))
    assert err[layout_line + 1] == f"planc: plugins {TAKES_PART}"


def test_verify_names_the_plugins_taking_part_as_explain_does(tmp_path, capsys, monkeypatch):
    """At launch and in the report (text: explain's plugins line; --json: explain's strategies)."""
    from planc import launch

    def measured(compiled, run_dir, steps):  # each rank's record, as the program writes it
        (run_dir / "verify").mkdir()
        for rank in range(2):
            record = {"rank": rank, "coordinates": {"pp": 0, "dp": rank}, "model_states": dict.fromkeys(STATES, 1)}
            (run_dir / "verify" / f"rank{rank}.json").write_text(json.dumps(record))
        return 0

    monkeypatch.setattr(launch, "launch_local", measured)
    monkeypatch.setenv("PLANC_VERIFY_DIR", str(tmp_path / "results"))
    assert main(["verify", str(POWERSGD_PLAN), "--out", str(tmp_path / "v")]) == 0
    out, err = capsys.readouterr()
    assert f"planc verify: plugins {TAKES_PART}" in err.splitlines()
    assert out.splitlines()[1] == f"  plugins   {TAKES_PART}"
    assert main(["verify", str(POWERSGD_PLAN), "--out", str(tmp_path / "v2"), "--json"]) == 0
    names = [(s["name"], s["builtin"], s["named"]) for s in json.loads(capsys.readouterr().out)["strategies"]]
    assert names == [("ddp", True, False), ("powersgd", False, True)]  # DDP first: powersgd is AFTER it


def test_on_a_cpu_the_hooks_own_ops_cost_per_compressed_matrix(tmp_path):
    """25 ops per compressed matrix at the profile's cost per op: this GPT (h 256, rank 4) compresses
    every matrix, 6 per block x 4 + embedding, positions and output = 27. Not on a GPU (there the
    host runs ahead of the kernels), nor without a profile (a CPU's cost per op is then 0)."""
    from planc_powersgd.compression import compressed_matrices
    from planc_powersgd.strategy import HOOK_HOST, HOOK_OPS_PER_MATRIX

    spec = plan().model
    assert compressed_matrices(spec, tp=1, rank=4) == 27
    profile = tmp_path / "cpu.json"
    from tests.calibrate.test_profile import profile_dict

    raw = profile_dict()
    raw["measured"] = {**raw["measured"], "seconds_per_op": 5e-6}
    profile.write_text(json.dumps(raw))
    cpu_plan = build_plan(
        {
            "model": {"layers": 4, "hidden": 256, "heads": 8, "vocab": 1000, "seq_len": 128},
            "hardware": {"device": "cpu", "per_node": 8, "profile": str(profile)},
            "train": {"global_batch": 64},
            "uses": [{"name": "powersgd", "options": {"rank": 4}}],
        }
    )
    lay = layout()
    parts = evaluate(cpu_plan, lay, load_registry().passes(cpu_plan, lay)).step_parts()
    assert parts[HOOK_HOST] == pytest.approx(27 * HOOK_OPS_PER_MATRIX * 5e-6)
    gpu_plan = plan(uses=[("powersgd", {"rank": 4})])
    assert HOOK_HOST not in evaluate(gpu_plan, lay, load_registry().passes(gpu_plan, lay)).step_parts()
