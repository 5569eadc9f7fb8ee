"""The emitted program never pastes user text into code (the brief's "safe by construction").

Every piece of user text that reaches the program — the model name, the plan's path, the data
file's path, a plugin option — is made hostile: quotes of every kind, a triple quote, newlines,
a Unicode line separator, backslashes and a ``__import__`` call that would leave a trace on disk if
it ever ran. The program must parse, define exactly the expected top-level statements, run none of
the payload, and carry the text back verbatim as data.
"""

import ast
from pathlib import Path

import pytest

from planc.codegen import compile_plan
from planc.dsl.load import load_plan_text
from planc.strategies.registry import load_registry

TRACE = "PWNED_BY_PLANC_TEST"
PAYLOAD = (
    f'x"""\n__import__("pathlib").Path("{TRACE}").touch()\n"""\'\'\'\u2028'
    f"\\\\n# \\\" ') ; __import__('pathlib').Path('{TRACE}').touch() #"
)


def _plan_text(name: str, data: str) -> str:
    quoted = name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    quoted_data = data.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f"""
model "{quoted}" {{
  layers = 2  hidden = 64  heads = 4  vocab = 256  seq_len = 32
}}
hardware {{ device = "cpu"  per_node = 2 }}
train {{ global_batch = 4  micro_batch = 2  precision = fp32  data = "{quoted_data}" }}
layout {{ tp = 1  pp = 1  dp = 2  zero = 0  recompute = none }}
"""


@pytest.fixture
def hostile_plan(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    directory = tmp_path / 'evil"""dir\n__import__'
    directory.mkdir()
    data_file = directory / 'data\'"""x.txt'
    data_file.write_bytes(bytes(range(256)) * 64)
    source = directory / f'{TRACE}\'"""\n.plan'
    text = _plan_text(PAYLOAD, str(data_file))
    source.write_text(text)
    return load_plan_text(text, str(source), strategies=load_registry(), base_dir=directory)


def test_hostile_text_stays_data(hostile_plan, tmp_path):
    assert hostile_plan.model.name == PAYLOAD  # the parser kept it verbatim
    program = compile_plan(hostile_plan, load_registry()).program
    tree = ast.parse(program)
    kinds = [type(node).__name__ for node in tree.body]
    assert kinds[0] == "Expr" and kinds[-2:] == ["FunctionDef", "If"]
    assert set(kinds[1:-2]) <= {"Import", "ImportFrom", "Assign"}
    # No call anywhere in the module names __import__, eval, exec, compile or open.
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    assert not called & {"__import__", "eval", "exec", "compile", "open", "getattr"}
    # The payload travels as string constants: the one holding the model name is it, verbatim.
    constants = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
    assert PAYLOAD in constants
    namespace: dict = {"__name__": "emitted"}
    exec(compile(program, "train.py", "exec"), namespace)
    assert namespace["PLAN"].model.name == PAYLOAD
    assert namespace["PLAN"].train.data == hostile_plan.train.data
    assert not (tmp_path / TRACE).exists() and not Path(TRACE).exists()


def test_docstring_quotes_no_user_text_raw(hostile_plan):
    program = compile_plan(hostile_plan, load_registry()).program
    docstring = ast.get_docstring(ast.parse(program))
    assert '"""' not in docstring and "\n__import__" not in docstring
    assert "\u2028" not in program.split('"""', 2)[1]
