"""The path a third-party plugin takes through planc, with the broken plugins of an author's review
(``review_plugins/``): a plugin without Options, hooks that raise, a plugin that joins plans on its
own, a name clash seen from a compiled program, torch at plan time, an option .plan cannot write."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from plugin_fixtures import good_plugin, tiny_layout, tiny_plan
from pydantic import BaseModel

from planc.cli import main
from planc.codegen import compile_plan
from planc.dsl.load import load_plan_text
from planc.errors import PlanError
from planc.spec.issues import SpecError
from planc.spec.plan_json import plan_from_json_text
from planc.strategies.composition import BUILTIN_ORDER
from planc.strategies.registry import load_registry

REVIEW = Path(__file__).resolve().parent / "review_plugins"
ROOT = Path(__file__).resolve().parents[2]
DIST = "planc-bad-plugins"
#: install_plugin names each module "<distribution>_<entry>".
PREFIX = DIST.replace("-", "_")

TINY = """\
model { layers = 2  hidden = 64  heads = 4  vocab = 256  seq_len = 32 }
hardware { device = "cpu"  per_node = 2 }
train { global_batch = 4  micro_batch = 2  precision = fp32 }
layout { tp = 1  pp = 1  dp = 2  zero = 0  recompute = none }
"""


def source(name: str) -> str:
    return (REVIEW / f"{name}.py").read_text(encoding="utf-8")


def line_of(name: str, marker: str) -> int:
    """The 1-based line of ``review_plugins/NAME.py`` holding ``marker`` (where the plugin fails)."""
    return next(i for i, line in enumerate(source(name).splitlines(), 1) if marker in line)


def plan(uses=()):
    return tiny_plan(uses)


def layout(**fields):
    return tiny_layout(**{"dp": 8, **fields})


# -- 1: a plugin without Options ---------------------------------------------------------------


def test_a_plugin_without_options_gets_the_registrys_empty_options_in_the_program(install_plugin, tmp_path):
    install_plugin(DIST, "0.0.1", {"apply_raises": source("apply_raises")})
    registry = load_registry(refresh=True)
    program = compile_plan(load_plan_text(TINY + "use apply_raises { }\n", strategies=registry), registry).program
    tree = ast.parse(program)
    (call,) = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "apply"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "apply_raises"
    ]
    namespace: dict = {"__name__": "emitted"}
    exec(compile(program, "train.py", "exec"), namespace)
    # What the program hands apply(): the module declares no Options, so the registry's own
    # empty model must build it (the module's missing `Options` was an AttributeError at run time).
    options = eval(compile(ast.Expression(call.args[1]), "train.py", "eval"), namespace)
    assert isinstance(options, BaseModel) and not type(options).model_fields


# -- 2: options are as strict as the core language's keys --------------------------------------


@pytest.mark.parametrize(
    ("value", "message", "hint"),
    [
        (True, "option 'rank' of strategy 'good' must be a whole number, got true", "Rank of the thing."),
        ("7", "option 'rank' of strategy 'good' must be a whole number, got \"7\"", "Rank of the thing."),
        (3.0, "option 'rank' of strategy 'good' must be a whole number, got 3.0", "leave out the decimal point: 3"),
    ],
)
def test_a_plugin_option_is_not_coerced(install_plugin, value, message, hint):
    install_plugin("planc-goodplugin", "1.0", {"good": good_plugin("good")})  # Options without strict=True
    with pytest.raises(SpecError) as info:
        load_registry(refresh=True).strategies["good"].options_for(plan(uses=[("good", {"rank": value})]))
    (issue,) = info.value.issues
    assert issue.path == ("uses", 0, "options", "rank")
    assert issue.message == message
    assert issue.hint.startswith(hint)


def test_a_builtin_option_is_not_coerced():
    ddp = load_registry(refresh=True).strategies["ddp"]
    with pytest.raises(SpecError) as info:
        ddp.options_for(plan(uses=[("ddp", {"bucket": True})]))
    assert [i.message for i in info.value.issues] == ["option 'bucket' of strategy 'ddp' must be a number, got true"]
    assert ddp.validate_options({"bucket": 25}).bucket == 25.0  # a whole number is a number (plan.json: bytes)


TIMED_PLUGIN = """
from pydantic import BaseModel, ConfigDict
from planc.spec.fields import Bandwidth, Seconds

NAME = "timed"
API_VERSION = 1
DESCRIPTION = "a plugin whose options carry units"


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")
    link: Bandwidth = 50e9
    pause: Seconds = 0.25


def apply(job, options):
    pass
"""


@pytest.mark.parametrize(
    ("written", "where", "message", "hint"),
    [
        # 50e9 B/s = 50 GB/s; 0.25 s = 250 ms: each option's own default, in its unit. The column
        # is the number's: "use timed { " is 12 characters, then "link = " (7) or "pause = " (8).
        ("link = 50", "5:20", "needs a unit: a bandwidth, e.g. 300 GB/s or 200 Gb/s", "e.g. 50 GB/s (the default)"),
        ("pause = 2", "5:21", "needs a unit: a time, e.g. 500 ms or 2 h", "e.g. 250 ms (the default)"),
    ],
)
def test_a_plugin_option_with_a_unit_written_without_one_is_refused(install_plugin, written, where, message, hint):
    """A bare number for a unit option is 25 what? Refused, not taken in base units (bucket = 25
    would be 25-byte buckets), as the core keys refuse ``memory = 16``."""
    install_plugin("planc-timed", "1.0", {"timed": TIMED_PLUGIN})
    text = TINY + f"use timed {{ {written} }}\n"
    with pytest.raises(PlanError) as info:
        load_plan_text(text, "t.plan", strategies=load_registry(refresh=True))
    key = written.split()[0]
    assert str(info.value).startswith(f"t.plan:{where}: error: option '{key}' of strategy 'timed' {message}")
    assert info.value.hint == f"write the unit after the number, {hint}"


def test_a_plugin_option_with_its_unit_and_from_plan_json_is_taken(install_plugin):
    """Written with a unit in a .plan, or as base units in plan.json (no unit syntax there)."""
    install_plugin("planc-timed", "1.0", {"timed": TIMED_PLUGIN})
    registry = load_registry(refresh=True)
    written = load_plan_text(TINY + "use timed { link = 10 GB/s  pause = 5 ms }\n", "t.plan", strategies=registry)
    assert registry.strategies["timed"].options_for(written).model_dump() == {"link": 10e9, "pause": 0.005}
    from_json = plan_from_json_text(json.dumps(written.model_dump(mode="json")), "plan.json")
    assert from_json.uses[0].options == {"link": 10e9, "pause": 0.005}
    assert registry.strategies["timed"].options_for(from_json).model_dump() == {"link": 10e9, "pause": 0.005}


def test_every_shipped_plan_still_loads():
    registry = load_registry(refresh=True)
    plans = [
        path
        for folder in ("plans", "docs", "tests", "bench")
        for path in sorted((ROOT / folder).rglob("*.plan"))
        if "errors" not in path.parts and "bad" not in path.stem
    ]
    uses = [p for p in plans if "\nuse " in "\n" + p.read_text(encoding="utf-8")]
    assert uses, "no shipped plan has a use block"
    for path in uses:
        try:
            load_plan_text(path.read_text(encoding="utf-8"), str(path), strategies=registry, base_dir=path.parent)
        except PlanError as error:
            assert "strategy" not in str(error) and "option" not in str(error), f"{path}: {error}"


# -- 4, 5: a plugin's hook that raises ---------------------------------------------------------


def test_a_failed_import_names_the_plugins_file_and_line(install_plugin, tmp_path, monkeypatch, capsys):
    install_plugin(DIST, "0.0.1", {"broken_deep": source("broken_deep")})
    monkeypatch.setenv("PLANC_DEBUG", "1")
    registry = load_registry(refresh=True)
    (problem,) = [p for p in registry.problems if p.name == "broken_deep"]
    where = f"{tmp_path / (PREFIX + '_broken_deep.py')}:{line_of('broken_deep', 'undefined_name')}"
    assert f"failed at {where}: NameError" in problem.message
    assert "Traceback" in capsys.readouterr().err  # PLANC_DEBUG=1 shows it, as for planc's own errors


def test_an_enabled_that_raises_skips_the_plugin_for_plans_that_do_not_name_it(install_plugin, tmp_path, capsys):
    install_plugin(DIST, "0.0.1", {"enabled_raises": source("enabled_raises")})
    registry = load_registry(refresh=True)
    assert [s.name for s in registry.active(plan(), layout())] == ["ddp"]  # no error: the plan never named it
    (notice,) = registry.notices()
    where = f"{tmp_path / (PREFIX + '_enabled_raises.py')}:{line_of('enabled_raises', 'dp_size')}"
    assert notice.skipped and f"failed in enabled() at {where}: AttributeError" in notice.message
    assert "enabled_raises" not in registry.strategies
    assert "Traceback" not in capsys.readouterr().err  # only under PLANC_DEBUG=1


def test_a_raising_hook_of_a_plugin_the_plan_names_is_located_at_its_use_block(install_plugin, tmp_path):
    install_plugin(DIST, "0.0.1", {"enabled_raises": source("enabled_raises"), "check_raises": source("check_raises")})
    registry = load_registry(refresh=True)
    (issue,) = registry.check(plan(uses=[("enabled_raises", {})]), layout())
    assert issue.path == ("uses", 0, "name")
    assert "failed in enabled()" in issue.message
    text = TINY + "use check_raises { }\n"
    with pytest.raises(PlanError) as info:
        load_plan_text(text, "f.plan", strategies=registry)
    error = info.value
    assert (error.location.file, error.location.line) == ("f.plan", 5)
    where = f"{tmp_path / (PREFIX + '_check_raises.py')}:{line_of('check_raises', 'nonexistent_attribute')}"
    assert f"failed in check() at {where}: AttributeError" in error.message
    # PLANC_PLUGINS would turn `use check_raises` into "unknown strategy plugin": say what helps.
    assert "PLANC_PLUGINS" not in error.hint and "remove the `use check_raises` block" in error.hint


def test_a_raising_hook_of_a_plugin_the_plan_does_not_name_suggests_leaving_it_out(install_plugin):
    always_failing = source("always_on").replace("return estimate.with_time", "raise KeyError('oops')  #")
    install_plugin(DIST, "0.0.1", {"always_on": always_failing})
    registry = load_registry(refresh=True)
    with pytest.raises(PlanError) as info:
        registry.strategies["always_on"].cost(SimpleNamespace(plan=plan()), None, None)
    assert "'always_on' (from planc-bad-plugins 0.0.1) failed in cost()" in info.value.message
    assert f"PLANC_PLUGINS={','.join(BUILTIN_ORDER)}" in info.value.hint


# -- 6: a plugin that joins on its own is named by explain -------------------------------------


def test_explain_names_a_plugin_that_joins_a_plan_that_does_not_name_it(install_plugin, tmp_path, capsys):
    install_plugin(DIST, "0.0.1", {"always_on": source("always_on")})
    load_registry(refresh=True)
    plan_file = tmp_path / "nouse.plan"
    plan_file.write_text(TINY, encoding="utf-8")
    assert main(["explain", str(plan_file), "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    # In composition order: always_on declares no AFTER, so the names break the tie.
    assert [(s["name"], s["builtin"], s["distribution"], s["named"]) for s in body["strategies"]] == [
        ("always_on", False, DIST, False),
        ("ddp", True, "planc", False),
    ]
    assert main(["explain", str(plan_file)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  plugins")]
    assert lines == [
        "  plugins   always_on (planc-bad-plugins 0.0.1; not named by the plan: the installed plugin joins on its own)"
    ]


def test_explain_of_built_ins_alone_has_no_plugins_line(tmp_path, capsys):
    load_registry(refresh=True)
    plan_file = tmp_path / "nouse.plan"
    plan_file.write_text(TINY, encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PLANC_PLUGINS", ",".join(BUILTIN_ORDER))
        assert main(["explain", str(plan_file)]) == 0
    assert "  plugins" not in capsys.readouterr().out


# -- 7: a plugin skipped for a name clash, seen from a compiled program ------------------------


def test_a_program_names_the_real_reason_a_plugin_is_missing(install_plugin, capsys):
    install_plugin("planc-lowp-allreduce", "0.1.0", {"lowp_allreduce": good_plugin("lowp_allreduce")})
    install_plugin("planc-dup", "0.2.0", {"lowp_allreduce": source("dup_lowp_allreduce")})
    with pytest.raises(PlanError) as info:
        load_registry(refresh=True)["lowp_allreduce"]
    message = info.value.message
    assert "'lowp_allreduce' (from planc-" in message and "is installed but was not loaded" in message
    assert "is also registered by planc-" in message and "no strategy named" not in message
    assert info.value.hint[0].isalpha()
    from planc.strategies.registry import load_strategy

    with pytest.raises(SystemExit) as stop:
        load_strategy("lowp_allreduce")  # what the emitted program calls: a message, no traceback
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: strategy plugin 'lowp_allreduce'") and "Traceback" not in err


def test_an_unknown_plugins_hint_reads_as_a_sentence():
    (issue,) = load_registry(refresh=True).check(plan(uses=[("lowp_allreduce", {})]), layout())
    assert issue.message == "unknown strategy plugin 'lowp_allreduce'"
    assert issue.hint == (
        "run `planc plugins` to list installed strategies; a third-party strategy must be pip-installed"
    )


# -- 3, 9: problems `planc plugins` reports ----------------------------------------------------


def test_an_option_type_a_plan_cannot_write_is_a_problem(install_plugin):
    install_plugin(DIST, "0.0.1", {"weird_schema": source("weird_schema")})
    registry = load_registry(refresh=True)
    (problem,) = [p for p in registry.problems if p.name == "weird_schema"]
    assert not problem.skipped and "option 'table' has the type dict[str, int]" in problem.message
    assert "weird_schema" in registry.strategies  # a warning: its default still works


def test_a_plugin_importing_torch_at_plan_time_is_warned_about(install_plugin, tmp_path, monkeypatch, capsys):
    install_plugin(DIST, "0.0.1", {"imports_torch": source("imports_torch")})
    # This process has imported torch already; the plugin's `import torch` finds a stand-in
    # (tmp_path is first on sys.path), as a plan-time process without torch would import it.
    (tmp_path / "torch.py").write_text('"""A stand-in for torch."""\n', encoding="utf-8")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    load_registry(refresh=True)
    assert main(["plugins"]) == 0
    listed = capsys.readouterr().out
    assert f"imports_torch (from {DIST} 0.0.1) [warning]: importing '{PREFIX}_imports_torch' imported torch" in listed
    plan_file = tmp_path / "use.plan"
    plan_file.write_text(TINY + "use ddp { }\n", encoding="utf-8")
    assert main(["check", str(plan_file), str(plan_file)]) == 0
    assert capsys.readouterr().err.count("imported torch") == 1  # once, not once per file
