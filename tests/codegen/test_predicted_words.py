"""The emitted program says what explain says about its prediction (review findings 5 and 6):
sizes in planc's units, the step time's band or "(uncalibrated)", and the memory warning."""

import ast

from planc.codegen import compile_plan
from planc.strategies.registry import load_registry
from planc.units import format_bytes

from .conftest import plan_at


def _predicted(program: str) -> dict:
    """The program's PREDICTED, as a literal."""
    (assign,) = [n for n in ast.parse(program).body if isinstance(n, ast.Assign) and n.targets[0].id == "PREDICTED"]
    return ast.literal_eval(assign.value)


def _start_up_line(program: str) -> str:
    """What rank 0 prints first about the prediction: the program's own f-string, evaluated on its
    own PREDICTED (no torch, no process group)."""
    tree = ast.parse(program)
    (assign,) = [n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "PREDICTED"]
    predicted = ast.literal_eval(assign.value)
    (call,) = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "print" and "PREDICTED" in ast.unparse(n)
    ]
    return eval(
        compile(ast.Expression(call.args[0]), "train.py", "eval"),
        {"PREDICTED": predicted, "format_bytes": format_bytes},
    )


def test_a_cpu_plan_prints_mib_with_units_and_says_its_step_is_uncalibrated(in_root):
    program = compile_plan(plan_at("plans/tiny-cpu.plan"), load_registry()).program
    step = f"{_predicted(program)['step_s']:.3g}"  # the program's own prediction, to 3 figures
    # 32.99 MiB (explain's total) of 4 GiB less 5% headroom = 3.8 GiB; the 'cpu' preset: no band
    assert _start_up_line(program) == f"predicted: 33.0 MiB per device of 3.8 GiB; step {step} s (uncalibrated)"
    assert f"Predicted   33.0 MiB of 3.8 GiB per device; step {step} s (uncalibrated);" in ast.get_docstring(
        ast.parse(program)
    )
    assert "/ 2**30" not in program


def test_a_gpu_plan_near_its_limit_carries_the_band_and_the_warning(in_root):
    from planc.explain.report import render_text
    from planc.planner import choose

    plan = plan_at("plans/llama3-70b-64xh100.plan")
    program = compile_plan(plan, load_registry()).program
    doc = ast.get_docstring(ast.parse(program))
    # explain's step time and memory, to the figures the program prints, with the published runs'
    # band (±9%); memory over 90% of the device
    choice = choose(plan, load_registry())
    explained = render_text(plan, choice)
    (seconds,) = [line.split()[2] for line in explained.splitlines() if line.strip().startswith("step time ")]
    step = f"{float(seconds):.3g}"
    need, has = choice.estimate.memory_bytes / 2**30, choice.estimate.capacity / 2**30
    assert need / has > 0.9, "the plan is no longer near its limit: pick another"
    assert f"step {step} s ±9%;" in doc
    assert f"Warning     memory close to the limit: {need:.1f} GiB of {has:.1f} GiB ({need / has:.0%})" in doc
    assert _start_up_line(program) == f"predicted: {need:.1f} GiB per device of {has:.1f} GiB; step {step} s ±9%"
    # a plan well within its memory has no warning
    assert "Warning" not in ast.get_docstring(
        ast.parse(compile_plan(plan_at("plans/tiny-cpu.plan"), load_registry()).program)
    )


def test_the_progress_line_reads_the_programs_band_as_a_number(in_root):
    """The progress line took its band from PREDICTED["step_band"], explain's words; the program now
    carries the number too (the published runs' band, accuracy.json's 0.0944, for a GPU plan; None
    for the uncalibrated 'cpu' preset), and the progress line prints what the start-up line does."""
    from planc.cost.uncertainty import accuracy_table
    from planc.runtime.metrics import format_progress

    record = {"step": 1, "loss": 1.0, "lr": 0.1, "step_s": 25.0, "memory_bytes": 0}
    gpu = _predicted(compile_plan(plan_at("plans/llama3-70b-64xh100.plan"), load_registry()).program)
    assert gpu["step_uncertainty"] == accuracy_table()["band"]["step_time_relative"] and gpu["step_band"] == "±9%"
    line = format_progress({**record, "predicted_step_s": gpu["step_s"]}, predicted=gpu)
    assert f"25.000 s/step (pred {gpu['step_s']:.3f} ±9%)" in line  # explain's "step 23.8 s ±9%"
    cpu = _predicted(compile_plan(plan_at("plans/tiny-cpu.plan"), load_registry()).program)
    assert cpu["step_uncertainty"] is None and cpu["step_band"] == "(uncalibrated)"
    line = format_progress({**record, "predicted_step_s": cpu["step_s"]}, predicted=cpu)
    assert f"(pred {cpu['step_s']:.3f}, uncalibrated)" in line


def test_planc_run_under_torchrun_trains_against_the_programs_own_prediction(in_root, tmp_path, monkeypatch):
    """`torchrun ... -m planc run FILE` trains in place (running.md): it must log each step beside the
    same PREDICTED as the program it writes, band included -- it passed the step time alone, so its
    progress line lost "uncalibrated" (the 'cpu' preset has no band: step_uncertainty None)."""
    import planc.runtime.compose
    import planc.runtime.loop
    from planc.commands.run import _run_in_place

    seen = {}
    monkeypatch.setattr(planc.runtime.compose, "compose", lambda *args: "job")  # no process group here
    monkeypatch.setattr(planc.runtime.loop, "train", lambda job, **kwargs: seen.update(kwargs))
    monkeypatch.setattr(planc.runtime.loop, "shutdown", lambda: None)
    monkeypatch.delenv("RANK", raising=False)  # rank 0: writes train.py into --out, as under torchrun
    registry = load_registry()
    compiled = compile_plan(plan_at("plans/tiny-cpu.plan"), registry)
    assert _run_in_place(compiled, registry, tmp_path / "run", None) == 0
    assert seen["predicted"] == _predicted((tmp_path / "run" / "train.py").read_text())
    assert seen["predicted"]["step_uncertainty"] is None
