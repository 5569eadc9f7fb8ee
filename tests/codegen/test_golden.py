"""Emitted programs compared with checked-in files (sqlglot-style golden tests).

The golden files were read line by line when they were written: the docstring's torchrun command
matches the plan's processes, the strategies appear in composition order with the layout's
options, and the plan data equals `planc check --json` minus derived fields. Regenerate after an
intended change with ``PLANC_UPDATE_GOLDEN=1 python -m pytest tests/codegen/test_golden.py`` and
read the diff.
"""

import ast
import os

import pytest

from planc.codegen import compile_plan
from planc.codegen.emit import torchrun_command
from planc.strategies.registry import load_registry

from .conftest import GOLDEN, has_powersgd, plan_at

CASES = {
    "tiny-cpu": "plans/tiny-cpu.plan",
    "cpu-3d": "plans/cpu-3d.plan",
    "pp2-tp2": "tests/codegen/data/pp2-tp2.plan",
    "powersgd": "tests/codegen/data/powersgd.plan",
}


@pytest.mark.parametrize("name", CASES)
def test_emitted_program_matches_golden(name, in_root):
    if name == "powersgd" and not has_powersgd():
        pytest.skip("planc-powersgd is not installed (pip install -e plugins/planc-powersgd)")
    program = compile_plan(plan_at(CASES[name]), load_registry()).program
    golden = GOLDEN / f"{name}.py"
    if os.environ.get("PLANC_UPDATE_GOLDEN") == "1":
        golden.write_text(program, encoding="utf-8")
    assert program == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", CASES)
def test_program_structure(name, in_root):
    """Docstring with the torchrun command, then imports, PLAN, LAYOUT, main() — nothing else."""
    if name == "powersgd" and not has_powersgd():
        pytest.skip("planc-powersgd is not installed")
    plan = plan_at(CASES[name])
    compiled = compile_plan(plan, load_registry())
    tree = ast.parse(compiled.program)
    docstring = ast.get_docstring(tree)
    assert torchrun_command(plan) in docstring
    assert f"--nproc-per-node {plan.hardware.per_node}" in docstring
    kinds = [type(node).__name__ for node in tree.body]
    assert kinds[0] == "Expr" and kinds[-2:] == ["FunctionDef", "If"]
    assigned = [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    assert {"PLAN", "LAYOUT"} <= set(assigned)
    # Each active strategy is applied once, in the registry's composition order.
    calls = [
        node.func.value.id
        for node in ast.walk(tree.body[-2])
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "apply"
        and isinstance(node.func.value, ast.Name)
    ]
    expected = [s.module.rsplit(".", 1)[-1] if s.builtin else s.name for s in compiled.strategies]
    assert calls == expected


def test_plan_and_layout_round_trip_through_the_program(in_root):
    plan = plan_at("plans/cpu-3d.plan")
    compiled = compile_plan(plan, load_registry())
    namespace: dict = {"__name__": "emitted"}  # not __main__: defines, does not train
    exec(compile(compiled.program, "train.py", "exec"), namespace)
    assert namespace["PLAN"] == plan
    assert namespace["LAYOUT"] == compiled.layout
