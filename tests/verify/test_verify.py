"""``planc verify``'s plan-time half: the CPU stand-in, the result key, the comparison rows, and
explain's measured table. (The measurements themselves: test_verify_dist.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from planc.cli import main
from planc.dsl.load import load_plan
from planc.planner import choose
from planc.spec import build_plan
from planc.strategies.registry import load_registry
from planc.verify import results
from planc.verify.report import Row, rows_for_rank
from planc.verify.stand_in import MAX_CPU_PARAMS, MAX_CPU_PROCESSES, CannotStandIn, stand_in

PLANS = Path(__file__).resolve().parents[2] / "plans"
REGISTRY = load_registry()


def _chosen(name: str):
    plan = load_plan(PLANS / name, strategies=REGISTRY)
    return plan, choose(plan, REGISTRY).layout


def test_a_cpu_plan_runs_as_written():
    plan, layout = _chosen("cpu-3d.plan")
    assert stand_in(plan, layout, cuda_devices=0).changes == ()


def test_a_stand_in_with_one_data_parallel_rank_drops_zero():
    """TP 8 x ZeRO-3 over 4 data-parallel ranks (the course's 16-overlap plan) stands in on 8
    processes with one data-parallel rank: ZeRO over one rank shards nothing, no plan may ask for
    it, and run anyway (FSDP over one rank) it held what the cost model prices for no sharding."""
    plan, layout = _chosen("course/16-overlap.plan")
    assert (layout.tp, layout.dp, layout.zero) == (8, 4, 3)
    chosen = stand_in(plan, layout, cuda_devices=0)
    assert (chosen.plan.layout.dp, chosen.plan.layout.zero) == (1, 0)
    assert "ZeRO-3 -> none (one data-parallel rank has nothing to shard over)" in chosen.changes
    assert choose(chosen.plan, REGISTRY).layout.zero == 0  # a layout the planner accepts as written


def test_a_gpu_plan_gets_a_cpu_stand_in_with_the_same_layout_and_says_what_changed():
    plan, layout = _chosen("llama3-8b-8xh100.plan")
    chosen = stand_in(plan, layout, cuda_devices=0)
    small = chosen.plan
    assert small.hardware.device == "cpu" and small.world_size <= MAX_CPU_PROCESSES
    assert small.model.params <= MAX_CPU_PARAMS < plan.model.params
    # the model keeps its kind: GQA ratio, MLP, norm, positions
    assert small.model.heads // small.model.kv_heads == plan.model.heads // plan.model.kv_heads
    assert (small.model.mlp, small.model.norm, small.model.position) == (
        plan.model.mlp,
        plan.model.norm,
        plan.model.position,
    )
    # the planner's choice for the real plan is fixed in the stand-in
    again = choose(small, REGISTRY).layout
    assert (again.tp, again.pp, again.zero, again.recompute) == (layout.tp, layout.pp, layout.zero, layout.recompute)
    assert any("CPU processes" in c for c in chosen.changes)
    # the model's line says what it drops and what it keeps, read off the stand-in (not "same shape")
    (line,) = [c for c in chosen.changes if c.startswith("model ")]
    m, full = small.model, plan.model
    assert f"{m.layers} of {full.layers} layers, hidden {m.hidden} (of {full.hidden})" in line, line
    assert f"vocab {m.vocab} (of {full.vocab}), sequence {m.seq_len} (of {full.seq_len})" in line, line
    assert f"kept: {full.mlp} / {full.norm} / {full.position}" in line, line
    assert f"{full.heads // full.kv_heads} query head(s) per kv head" in line and "same shape" not in line
    # the same machine with the GPUs runs it as written
    assert stand_in(plan, layout, cuda_devices=8).changes == ()


def test_a_layout_wider_than_a_cpu_run_is_refused():
    plan, layout = _chosen("gpt3-175b-1024xa100.plan")
    assert layout.tp * layout.pp > MAX_CPU_PROCESSES  # TP 8 x PP 8 (the plan fixes them)
    with pytest.raises(CannotStandIn):
        stand_in(plan, layout, cuda_devices=0)


def test_the_result_key_follows_content_and_layout_not_the_file():
    plan, layout = _chosen("cpu-3d.plan")
    moved = plan.model_copy(update={"source": "elsewhere/cpu-3d.plan"})
    assert results.plan_key(moved, layout) == results.plan_key(plan, layout)
    assert results.plan_key(plan, layout.model_copy(update={"micro_batch": 1})) != results.plan_key(plan, layout)
    longer = plan.model_copy(update={"train": plan.train.model_copy(update={"lr": 1e-4})})
    assert results.plan_key(longer, layout) != results.plan_key(plan, layout)


def test_rows_hold_each_measurement_beside_its_prediction():
    measured = {
        "rank": 1,
        "model_states": {"params": 100, "grads": 100, "optimizer": 200},
        "activations": {"per_block_bytes": 50, "blocks_bytes": 100, "blocks": 2, "outside_bytes": 7},
        "comm": [{"kind": "all_reduce", "group": "dp", "bytes": 190.0, "calls": 3}],
        "peak": {"bytes": 1000, "source": "torch.distributed._tools.mem_tracker.MemTracker"},
        "step_s": [0.3, 0.1, 0.2],
    }
    predicted = {
        "model_states": {"params": 100, "grads": 101, "optimizer": 200},
        "activations": {"per_block_bytes": 55, "blocks_bytes": 110},
        "comm": {"dp": 200.0},
        "peak_bytes": 900,
        "peak_net_bytes": 850,
        "step_s": 0.25,
    }
    rows = {(r.section, r.name): r for r in rows_for_rank(measured, predicted)}
    assert rows[("model states", "grads")].error == pytest.approx(0.01)  # 101 / 100 - 1
    assert rows[("saved activations", "per block")].error == pytest.approx(0.1)  # 55 / 50 - 1
    assert rows[("communication", "dp")].error == pytest.approx(200 / 190 - 1)
    # MemTracker counts tensors: held against the prediction net of the allocator margin
    assert rows[("peak memory", "step peak")].error == pytest.approx(-0.15)  # 850 / 1000 - 1
    assert rows[("step time", "median step")].measured == 0.2  # the median of 3
    # ... beside the timed steps' own scatter, to read the error against
    assert rows[("step time", "median step")].note == "3 timed steps: 100.0 ms to 300.0 ms"
    assert rows[("saved activations", "embedding, final norm, head")].error is None  # no such term
    assert Row(0, "x", "y", 1.0, 0.0).error is None


def test_a_cuda_peak_is_held_against_the_prediction_net_of_what_the_allocator_does_not_count():
    """max_memory_allocated sees tensors only: no CUDA context, no allocator cache (the first GPU run
    compared it with the whole prediction, +9%, where the tensors alone were within 2%)."""
    states = {"params": 1, "grads": 1, "optimizer": 2}
    measured = {"rank": 0, "model_states": states, "peak": {"bytes": 1000, "reserved_bytes": 1100, "source": "cuda"}}
    predicted = {"model_states": states, "peak_bytes": 1300, "peak_net_bytes": 1050, "context_bytes": 150, "comm": {}}
    rows = {(r.section, r.name): r for r in rows_for_rank(measured, predicted)}
    assert rows[("peak memory", "allocated")].error == pytest.approx(0.05)  # 1050 / 1000 - 1
    assert rows[("peak memory", "reserved")].error == pytest.approx(1150 / 1100 - 1)  # 1300 - 150 context


def test_explain_shows_the_measured_table_for_the_same_plan_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PLANC_VERIFY_DIR", str(tmp_path / "results"))
    raw = {
        "model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 128, "seq_len": 32},
        "hardware": {"device": "cpu", "nodes": 1, "per_node": 2},
        "train": {"global_batch": 8, "micro_batch": 2, "precision": "fp32"},
        "layout": {"tp": 1, "pp": 1, "dp": 2, "zero": 0, "recompute": "none"},
    }
    path = tmp_path / "tiny.json"
    plan = build_plan(raw, source="tiny")
    path.write_text(plan.to_json())
    assert main(["explain", str(path)]) == 0
    assert "measured by planc verify" not in capsys.readouterr().out
    row = Row(0, "model states", "params", 1000.0, 990.0)
    result = {"key": results.plan_key(plan, choose(plan, REGISTRY).layout), "rows": [row.as_dict()], "world_size": 2}
    results.save({**result, "device": "cpu"}, tmp_path)
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "measured by planc verify" in out and "+1.0%" in out  # 1000 / 990 - 1
    assert main(["explain", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["measured"]["rows"][0]["measured"] == 990.0


def test_a_stored_result_this_planc_cannot_read_is_named_not_a_crash(tmp_path, monkeypatch, capsys):
    """Review (fix-rev): the key holds the plan, not planc's version, so another version's result (rows
    with a field this Row lacks) or a damaged file can sit under it; explain stopped with an internal
    error (TypeError from Row(**row)) instead of explaining the plan."""
    monkeypatch.setenv("PLANC_VERIFY_DIR", str(tmp_path / "results"))
    plan, layout = _chosen("tiny-cpu.plan")
    row = {**Row(0, "model states", "params", 1000.0, 990.0).as_dict(), "from_a_newer_planc": 1}
    saved = results.save({"key": results.plan_key(plan, layout), "rows": [row], "world_size": 4}, tmp_path)
    why = {
        saved.read_text(): "its rows are not this planc's (unknown field(s) from_a_newer_planc)",
        "{": "is not valid JSON",
        "[1]": "not a result of planc verify (no list of rows)",
    }
    for text, problem in why.items():
        saved.write_text(text)
        assert main(["explain", str(PLANS / "tiny-cpu.plan")]) == 0
        out, err = capsys.readouterr()
        assert "measured by planc verify" not in out and "memory per device" in out
        assert f"note: a stored `planc verify` result of this plan is not shown: {saved}" in err
        assert problem in err and "`planc verify` of the plan again replaces it" in err


def test_explain_says_when_the_plans_measurement_is_of_an_earlier_version(tmp_path, monkeypatch, capsys):
    """Review (fix-rev): verify a plan, edit it, explain it: the measured table went away without a
    word. A result filed for the same file under another key is named, and how to measure anew."""
    monkeypatch.setenv("PLANC_VERIFY_DIR", str(tmp_path / "results"))
    path = tmp_path / "tiny.plan"
    path.write_text((PLANS / "tiny-cpu.plan").read_text())
    other = tmp_path / "other.plan"
    other.write_text(path.read_text())
    plan, layout = _chosen("tiny-cpu.plan")
    row = Row(0, "model states", "params", 1000.0, 990.0).as_dict()
    result = {"key": results.plan_key(plan, layout), "rows": [row], "world_size": 4, "device": "cpu"}
    result["cost_model"] = results.cost_model_fingerprint()
    saved = results.save({**result, "plan_source": str(path.resolve())}, tmp_path)
    assert main(["explain", str(path)]) == 0  # as verified: the table, no note
    out, err = capsys.readouterr()
    assert "measured by planc verify" in out and "note:" not in err

    path.write_text(path.read_text().replace("lr           = 3e-3", "lr           = 1e-3"))  # edited since
    assert main(["explain", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "measured by planc verify" not in out
    assert f"note: `planc verify` measured {path} before it, or the layout chosen for it, changed ({saved})" in err
    assert f"`planc verify {path}` measures it as it is now" in err
    other.write_text(path.read_text())  # the edited content in a file never verified: nothing to say
    assert main(["explain", str(other)]) == 0
    assert "note:" not in capsys.readouterr().err


def test_verify_needs_its_measurement_steps(tmp_path, capsys):
    assert main(["verify", str(PLANS / "tiny-cpu.plan"), "--steps", "2"]) == 1
    assert "at least 4" in capsys.readouterr().err


def test_a_step_time_from_a_data_sheet_says_how_to_measure_this_machine(tmp_path):
    from planc.commands.verify import render
    from planc.spec import build_plan
    from planc.verify.report import step_time_basis

    sheet = build_plan({"model": {"preset": "gpt2"}, "hardware": {"device": "cpu"}, "train": {"global_batch": 8}})
    basis = step_time_basis(sheet.hardware)
    assert basis is not None and "'cpu' data sheet" in basis and "planc calibrate" in basis
    result = {"describe": "DDP", "world_size": 2, "device": "cpu", "rows": [], "step_time_basis": basis}
    assert render(result).endswith("note: " + basis)
    # A plan priced with a calibration of its hardware gets no such note.
    measured = sheet.hardware.model_copy(update={"profile": "cal.json"})
    assert step_time_basis(measured) is None
    assert "note:" not in render({**result, "step_time_basis": None})


def test_a_plan_shorter_than_the_measured_steps_gets_its_schedule_stretched(tmp_path, capsys, monkeypatch):
    """train.steps = 3 with min_lr = 0: the program refuses to train past step 3 (the schedule has decayed
    to 0 there), so verify's 5 steps must be launched under a schedule laid over 5 steps."""
    from planc import launch

    source = (PLANS / "tiny-cpu.plan").read_text()
    path = tmp_path / "short.plan"
    for key, value in (("steps", "3"), ("min_lr", "0"), ("warmup_steps", "1")):
        source = re.sub(rf"(?m)^(\s*{key}\s*=\s*)\S+", rf"\g<1>{value}", source, count=1)
    path.write_text(source)
    written = load_plan(path, strategies=REGISTRY)
    assert (written.train.steps, written.train.min_lr) == (3, 0.0)  # the plan as the test means it
    launched = []
    monkeypatch.setattr(
        launch, "launch_local", lambda compiled, run_dir, steps: launched.append((compiled, steps)) or 1
    )
    assert main(["verify", str(path), "--out", str(tmp_path / "v")]) == 1  # the stub "fails" after the launch
    ((compiled, steps),) = launched
    assert steps == 5 and compiled.plan.train.steps == 5
    assert "train.steps = 3 is below the 5 steps verify runs" in capsys.readouterr().err


def test_steps_before_a_strategy_works_as_priced_run_unmeasured_first(tmp_path, capsys, monkeypatch):
    """PowerSGD all-reduces uncompressed for its first start_iter steps (its ``steady_after``): verify
    measured those at first, and held an uncompressed step's traffic against the compressed
    prediction (-94 %). Now it runs them first, unmeasured, then its own steps, and says so."""
    import os

    from planc import launch

    pytest.importorskip("planc_powersgd")
    source = (PLANS.parent / "tests" / "codegen" / "data" / "powersgd.plan").read_text()
    path = tmp_path / "powersgd.plan"
    path.write_text(source.replace("rank = 2", "rank = 2\n  start_iter = 7"))
    launched = []

    def fake_launch(compiled, run_dir, steps):
        launched.append((compiled, steps, os.environ.get("PLANC_VERIFY_UNMEASURED")))
        return 1

    monkeypatch.setattr(launch, "launch_local", fake_launch)
    assert main(["verify", str(path), "--out", str(tmp_path / "v")]) == 1  # the stub "fails" after the launch
    ((compiled, steps, unmeasured),) = launched
    assert (steps, unmeasured) == (7 + 5, "7") and compiled.plan.train.steps >= 12
    err = capsys.readouterr().err
    assert "the first 7 steps run unmeasured (working as priced: powersgd after 7)" in err
    assert "PLANC_VERIFY_UNMEASURED" not in os.environ  # set for the launch only
    # A plan without such a strategy measures from the start.
    launched.clear()
    assert main(["verify", str(PLANS / "tiny-cpu.plan"), "--out", str(tmp_path / "w")]) == 1
    assert [(steps, unmeasured) for _, steps, unmeasured in launched] == [(5, "0")]
    # Past verify's limit it measures the steps before, and says the traffic and time are not the priced ones.
    launched.clear()
    path.write_text(source.replace("rank = 2", "rank = 2\n  start_iter = 5000"))
    assert main(["verify", str(path), "--out", str(tmp_path / "x")]) == 1
    assert [(steps, unmeasured) for _, steps, unmeasured in launched] == [(5, "0")]
    assert "working as priced only after more steps than verify runs first (200): powersgd after 5000" in (
        capsys.readouterr().err
    )


def test_the_predicted_peak_says_it_is_net_of_the_margin_and_context_wherever_it_is_shown(
    tmp_path, monkeypatch, capsys
):
    """Review finding 1: explain's memory table totals the allocator margin and the CUDA context in;
    verify's predicted peak leaves both out (what a tracker or max_memory_allocated counts), and the
    same page showed both as "predicted" with nothing saying so."""
    measured = {"rank": 0, "model_states": {"params": 1, "grads": 1, "optimizer": 2}, "peak": {"bytes": 1000}}
    predicted = {"model_states": measured["model_states"], "peak_bytes": 1300, "peak_net_bytes": 1050, "comm": {}}
    (peak,) = [r for r in rows_for_rank(measured, predicted) if r.section == "peak memory"]
    assert peak.predicted == 1050 and "net of the allocator margin and CUDA context" in peak.note
    cuda = {**measured, "peak": {"bytes": 1000, "reserved_bytes": 1100, "source": "cuda"}}
    notes = {r.name: r.note for r in rows_for_rank(cuda, {**predicted, "context_bytes": 150})}
    assert "net of the allocator margin and CUDA context" in notes["allocated"]
    assert "net of the CUDA context" in notes["reserved"]

    # explain, beside its table: tiny-cpu (fp32, CPU: no CUDA context) at 4 processes, its table total
    # = 13.36 (states) + 18.06 (activations) + the 5% margin = 32.99 MiB, of which the margin is
    # 5% of 31.42 = 1.57 MiB; the verify row's prediction is the 31.42 MiB net of it.
    monkeypatch.setenv("PLANC_VERIFY_DIR", str(tmp_path / "results"))
    plan, layout = _chosen("tiny-cpu.plan")
    row = Row(0, "peak memory", "step peak", 1000.0, 1000.0, note="MemTracker")
    result = {"key": results.plan_key(plan, layout), "rows": [row.as_dict()], "world_size": 4, "device": "cpu"}
    results.save(result, tmp_path)
    assert main(["explain", str(PLANS / "tiny-cpu.plan")]) == 0
    out = capsys.readouterr().out
    assert "    total                                             32.99" in out
    assert "    peak memory: predicted net of the allocator margin and CUDA context, as the allocator counts:" in out
    assert "      the total 32.99 MiB above, less 1.57 MiB = 31.42 MiB" in out  # no pipeline: no stage named
    assert main(["explain", str(PLANS / "tiny-cpu.plan"), "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert "net of the allocator margin" in body["measured"]["peak_predicted"]
    assert body["measured"]["peak_net_bytes"] == pytest.approx(body["memory"]["total_bytes"] / 1.05)


def test_the_peak_relation_names_a_pipeline_stage_only_under_a_pipeline_and_not_a_stand_ins_row(
    tmp_path, monkeypatch, capsys
):
    """Review (fix-rev): explain wrote "pipeline rank 0's total" beside a plan without a pipeline, and
    under a CPU stand-in related the plan's total (GPT-2: 12.00 GiB less 1.57 = 10.42 GiB) to a peak
    row whose prediction is the stand-in's (2.9 MiB), as if that row's prediction were 10.42 GiB."""
    monkeypatch.setenv("PLANC_VERIFY_DIR", str(tmp_path / "results"))
    row = Row(0, "peak memory", "step peak", 1000.0, 1000.0, note="MemTracker")

    def explained(name: str, **extra) -> str:
        plan, layout = _chosen(name)
        result = {"key": results.plan_key(plan, layout), "rows": [row.as_dict()], "world_size": 8, "device": "cpu"}
        results.save({**result, **extra}, tmp_path)
        assert main(["explain", str(PLANS / name)]) == 0
        return capsys.readouterr().out.split("measured by planc verify")[1]

    # cpu-3d: TP 2 x PP 2 x DP 2, so the table's stage is named, as the table's title names it.
    piped = explained("cpu-3d.plan")
    assert re.search(r"\n      pipeline rank \d's total [\d.]+ MiB above, less", piped)
    # GPT-2 on 8 A100s, verified here through a CPU stand-in: the relation is the plan's, said to be so.
    stand = explained("gpt2-small-8xa100.plan", stand_in=["device A100-80GB x 8 -> CPU processes"])
    assert "pipeline rank" not in stand
    assert "      for the plan, the total " in stand
    assert "the rows' prediction is the stand-in's, net the same way" in stand


def test_the_stored_parameters_are_named_for_what_they_are():
    """Review finding 2: under bf16 a rank stores the fp32 master copy, explain's "master weights
    (fp32)" row; verify compared it in a row named "params", explain's name for the bf16 working copy."""
    from planc.verify.predicted import estimate_for, predicted_for_rank

    for name, expected in (("gpt2-small-8xa100.plan", "master weights (fp32)"), ("tiny-cpu.plan", "params")):
        plan, layout = _chosen(name)
        ctx, est = estimate_for(plan, layout, REGISTRY)
        predicted = predicted_for_rank(ctx, est, 0)
        measured = {"rank": 0, "model_states": {"params": 1, "grads": 1, "optimizer": 1}}
        names = [r.name for r in rows_for_rank(measured, predicted) if r.section == "model states"]
        assert names == [expected, "grads", "optimizer"], name
        # the value is that row's of explain: the fp32 copy under bf16, the parameters under fp32
        memory = est.memory
        assert predicted["model_states"]["params"] == (memory.master if memory.master else memory.params)


def test_explain_says_when_the_measured_tables_predictions_are_another_cost_models(tmp_path, monkeypatch, capsys):
    """A result is filed by the plan, not by the code that priced it: after a planc upgrade (or an
    edit of the model) its predicted column is the old model's, beside tables of the new. explain
    shows it, says so, and says how to compare today's predictions; --json flags it."""
    monkeypatch.setenv("PLANC_VERIFY_DIR", str(tmp_path / "results"))
    path = tmp_path / "tiny.plan"
    path.write_text((PLANS / "tiny-cpu.plan").read_text())
    plan, layout = _chosen("tiny-cpu.plan")
    row = Row(0, "model states", "params", 1000.0, 990.0).as_dict()
    result = {"key": results.plan_key(plan, layout), "rows": [row], "world_size": 4, "device": "cpu"}
    for fingerprint, stale in ((results.cost_model_fingerprint(), False), ("0123456789abcdef", True), (None, True)):
        stored = {**result, "cost_model": fingerprint} if fingerprint else result  # None: a planc that kept none
        results.save(stored, tmp_path)
        assert main(["explain", str(path)]) == 0
        out, err = capsys.readouterr()
        assert "measured by planc verify" in out
        assert ("predicted by other cost-model code than this planc's" in err) is stale, err
        if stale:
            assert f"`planc verify {path}` compares today's predictions" in err
        assert main(["explain", "--json", str(path)]) == 0
        body = json.loads(capsys.readouterr().out)
        assert body["measured"]["predicted_by_another_model"] is stale


def test_the_cost_model_fingerprint_covers_the_modules_that_predict():
    """Every module the digest names exists (a rename would silently drop it), and it reads the
    cost passes of every built-in strategy."""
    root = Path(results.__file__).resolve().parent.parent
    for pattern in results.PREDICTING_MODULES:
        assert list(root.glob(pattern)), pattern
    passes = {p.parent.name for p in root.glob("strategies/*/cost_pass.py")}
    assert {"ddp", "zero1", "fsdp", "tensor_parallel", "pipeline", "recompute", "bf16"} <= passes


def test_another_runtimes_prediction_is_not_shown_beside_planc_programs_measurement(tmp_path, monkeypatch, capsys):
    """verify runs planc's program: `explain --runtime megatron-core-2024` predicts another one, so
    the stored measurement of planc's is not set beside it (review fix-rev)."""
    monkeypatch.setenv("PLANC_VERIFY_DIR", str(tmp_path / "results"))
    path = PLANS / "tiny-cpu.plan"
    plan, layout = _chosen("tiny-cpu.plan")
    row = Row(0, "model states", "params", 1000.0, 990.0).as_dict()
    stored = {"key": results.plan_key(plan, layout), "rows": [row], "world_size": 4, "device": "cpu"}
    results.save({**stored, "cost_model": results.cost_model_fingerprint()}, tmp_path)
    assert main(["explain", str(path)]) == 0
    assert "measured by planc verify" in capsys.readouterr().out
    assert main(["explain", "--runtime", "megatron-core-2024", str(path)]) == 0
    assert "measured by planc verify" not in capsys.readouterr().out
    assert main(["explain", "--json", "--runtime", "megatron-core-2024", str(path)]) == 0
    assert "measured" not in json.loads(capsys.readouterr().out)


def test_a_plugins_cost_pass_is_part_of_the_fingerprint(tmp_path):
    """A third-party strategy predicts too: a result priced with its cost pass is another model's
    once the plugin's code changes. The digest of a plan with PowerSGD reads the plugin's module;
    a plan without it reads none, and a changed copy of that module changes the digest."""
    pytest.importorskip("planc_powersgd")
    registry = load_registry()
    plan = load_plan(Path(__file__).resolve().parents[1] / "codegen" / "data" / "powersgd.plan", strategies=registry)
    layout = choose(plan, registry).layout
    sources = results.plugin_cost_sources(plan, layout, registry)
    assert {path.parts[-2] for path in sources} == {"planc_powersgd"}
    assert {"strategy.py", "compression.py"} <= {path.name for path in sources}
    source = next(path for path in sources if path.name == "compression.py")
    plain, plain_layout = _chosen("tiny-cpu.plan")
    assert results.plugin_cost_sources(plain, plain_layout, registry) == ()
    with_plugin = results.cost_model_fingerprint((source,))
    assert with_plugin != results.cost_model_fingerprint()
    edited = tmp_path / "compression.py"
    edited.write_bytes(source.read_bytes() + b"\n# a new version of the plugin\n")
    assert results.cost_model_fingerprint((edited,)) != with_plugin
