"""The emitted program says what explain says about its prediction (review findings 5 and 6):
sizes in planc's units, the step time's band or "(uncalibrated)", and the memory warning."""

import ast

from planc.codegen import compile_plan
from planc.strategies.registry import load_registry
from planc.units import format_bytes

from .conftest import plan_at


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
    # 32.99 MiB (explain's total) of 4 GiB less 5% headroom = 3.8 GiB; the 'cpu' preset: no band
    assert _start_up_line(program) == "predicted: 33.0 MiB per device of 3.8 GiB; step 0.129 s (uncalibrated)"
    assert "Predicted   33.0 MiB of 3.8 GiB per device; step 0.129 s (uncalibrated);" in ast.get_docstring(
        ast.parse(program)
    )
    assert "/ 2**30" not in program


def test_a_gpu_plan_near_its_limit_carries_the_band_and_the_warning(in_root):
    program = compile_plan(plan_at("plans/course/19-megatron-145b.plan"), load_registry()).program
    doc = ast.get_docstring(ast.parse(program))
    # explain: step 23.8 s ±9% (the published runs' band, 9.4%), memory 74.3 of 76.0 GiB = 98% > 90%
    assert "step 23.8 s ±9%;" in doc
    assert "Warning     memory close to the limit: 74.3 GiB of 76.0 GiB (98%)" in doc
    assert _start_up_line(program) == "predicted: 74.3 GiB per device of 76.0 GiB; step 23.8 s ±9%"
    # a plan well within its memory has no warning
    assert "Warning" not in ast.get_docstring(
        ast.parse(compile_plan(plan_at("plans/tiny-cpu.plan"), load_registry()).program)
    )
