"""The package's shape: no import cycle among planc's modules, small files, short functions,
and the light half (planning) free of torch.

Imports are read from the source (ast), every ``import`` and ``from ... import`` in a module,
at the top or inside a function, except those under ``if TYPE_CHECKING:`` (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "planc"

#: The most lines a module may have, and a function (its docstring not counted).
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
#: Functions allowed to be longer, and why. A code template or a table may be long (STYLE.md);
#: nothing else is.
LONG_FUNCTIONS = {
    "planc/codegen/emit.py:emit_program": "the emitted program's text is one f-string template",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The planc modules ``name`` imports when it runs (``from pkg import mod`` counts as ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            # ``from pkg import mod`` imports the module mod; ``from mod import name`` the module mod.
            submodules = {f"{base}.{alias.name}" for alias in node.names} & known
            found.update(submodules or {base})
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {m for m in found if m in known and m != name}


def import_graph() -> nx.DiGraph:
    mods = modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(mods)
    for name, path in mods.items():
        graph.add_edges_from((name, target) for target in imports_of(name, path, set(mods)))
    return graph


def test_no_import_cycle_among_planc_modules():
    cycles = list(nx.simple_cycles(import_graph()))
    shown = "\n".join(" -> ".join(cycle + cycle[:1]) for cycle in sorted(cycles, key=len)[:10])
    assert not cycles, f"{len(cycles)} import cycle(s), e.g.:\n{shown}"


#: What each layer must never import, directly or through others. Data flows one way:
#: text -> AST -> Plan -> (registry) -> candidates + estimates -> choice -> program -> processes.
LOWER_LAYERS = {
    "planc.stages": ("planc.",),
    "planc.zero_bubble": (  # zero-bubble's moments, on planc.stages' placements alone
        "planc.legality",
        "planc.spec",
        "planc.cost",
        "planc.planner",
        "planc.strategies",
        "planc.explain",
        "planc.codegen",
        "planc.runtime",
        "planc.dsl",
        "planc.verify",
    ),
    "planc.legality": ("planc.spec", "planc.cost", "planc.planner", "planc.strategies", "planc.dsl"),
    "planc.spec": (
        "planc.cost",
        "planc.planner",
        "planc.strategies",
        "planc.explain",
        "planc.codegen",
        "planc.runtime",
    ),
    "planc.cost": ("planc.planner", "planc.strategies", "planc.explain", "planc.codegen", "planc.runtime"),
    "planc.planner": ("planc.explain", "planc.codegen", "planc.runtime", "planc.commands", "planc.dsl"),
}


def test_lower_layers_do_not_reach_up():
    graph = import_graph()
    for layer, forbidden in LOWER_LAYERS.items():
        members = [m for m in graph if m == layer or m.startswith(layer + ".")]
        for module in members:
            reached = nx.descendants(graph, module)
            bad = sorted(m for m in reached if m.startswith(forbidden) and not m.startswith(layer))
            assert not bad, f"{module} imports {bad}"


def test_only_the_commands_load_the_registry():
    """The registry is loaded once, at the top (a command, or an emitted program) and handed down:
    no module below the commands calls ``load_registry``."""
    for name, path in modules().items():
        if name.startswith("planc.commands") or name == "planc.strategies.registry":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                called = getattr(node.func, "id", getattr(node.func, "attr", None))
                assert called != "load_registry", f"{name} loads the strategy registry itself"


def test_modules_are_small():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def function_lengths(path: Path) -> dict[str, int]:
    """Lines of each function (nested ones too), its docstring not counted."""
    lengths = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if ast.get_docstring(node, clean=False) is not None:
                doc = node.body[0]
                length -= doc.end_lineno - doc.lineno + 1
            lengths[node.name] = max(length, lengths.get(node.name, 0))
    return lengths


def test_functions_are_short():
    long = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for function, length in function_lengths(path).items():
            key = f"{path.relative_to(ROOT).as_posix()}:{function}"
            if length > MAX_FUNCTION_LINES and key not in LONG_FUNCTIONS:
                long[key] = length
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
    stale = [
        key
        for key in LONG_FUNCTIONS
        if function_lengths(ROOT / key.split(":")[0]).get(key.split(":")[1], 0) <= MAX_FUNCTION_LINES
    ]
    assert not stale, f"allowed long functions that are short now (remove them from LONG_FUNCTIONS): {stale}"


def test_every_built_in_strategy_is_a_package_of_the_same_shape():
    """One home per built-in: the contract (__init__), its pure cost pass, its run-time part."""
    from planc.strategies.composition import BUILTIN_ORDER

    for name in BUILTIN_ORDER:
        folder = PACKAGE / "strategies" / name
        assert sorted(p.name for p in folder.glob("*.py")) == ["__init__.py", "cost_pass.py", "runtime.py"], name


def top_level_imports(path: Path) -> set[str]:
    """Every module named by an import that runs when ``path`` is imported (not inside a function,
    not under ``if TYPE_CHECKING:``), absolute names; relative imports are not used in planc."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


#: The plan-time half: what check, explain, fmt, plugins, compile, presets, docs and prepare import. None of it may
#: import torch when it is imported (a strategy's run-time part is imported by its hooks, lazily).
PLAN_TIME = (
    "planc.stages",
    "planc.units",
    "planc.legality",
    "planc.spec",
    "planc.dsl",
    "planc.cost",
    "planc.planner",
    "planc.explain",
    "planc.codegen",
    "planc.strategies.api",
    "planc.strategies.registry",
    "planc.strategies.contract",
    "planc.strategies.composition",
    "planc.commands.check",
    "planc.commands.explain",
    "planc.commands.fmt",
    "planc.commands.plugins",
    "planc.commands.compile",
    "planc.commands.presets",
    "planc.commands.docs",
    "planc.commands.prepare",
    "planc.data",
)


def test_the_plan_time_half_imports_without_torch():
    from planc.strategies.composition import BUILTIN_ORDER

    mods = modules()
    starts = [m for m in mods if m.startswith(PLAN_TIME)]
    starts += [f"planc.strategies.{name}{part}" for name in BUILTIN_ORDER for part in ("", ".cost_pass")]
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        imported = top_level_imports(mods[name])
        torch = sorted(m for m in imported if m == "torch" or m.startswith("torch."))
        assert not torch, f"{name} imports {torch} when it is imported"
        parents = [name.rsplit(".", i)[0] for i in range(1, name.count(".") + 1)]  # imported first
        todo += [m for m in [*imported, *parents] if m in mods]
