"""The plugin registry: discovery through real entry points, contract checks, collisions, order."""

from __future__ import annotations

import subprocess
import sys

import pytest
from plugin_fixtures import good_plugin, tiny_layout, tiny_plan

from planc.errors import PlanError
from planc.spec import build_plan
from planc.spec.issues import SpecError
from planc.strategies import api
from planc.strategies.composition import BUILTIN_ORDER
from planc.strategies.registry import load_registry
from planc.units import Quantity

BUILTINS = {"ddp", "zero1", "fsdp", "tensor_parallel", "pipeline", "recompute", "bf16"}


plan, layout = tiny_plan, tiny_layout


def problems_of(reg, name):
    return [p for p in reg.problems if p.name == name]


def test_builtins_load_from_the_planc_distribution():
    reg = load_registry(refresh=True)
    assert BUILTINS <= set(reg.strategies)
    for name in BUILTINS:
        strategy = reg.strategies[name]
        assert strategy.distribution == "planc" and strategy.builtin
        assert strategy.description and strategy.module.API_VERSION == api.API_VERSION
    assert not [p for p in reg.problems if p.name in BUILTINS]


def test_a_good_plugin_is_first_class(install_plugin):
    install_plugin("planc-goodplugin", "1.2.3", {"good": good_plugin("good", after=("ddp",))})
    reg = load_registry(refresh=True)
    good = reg.strategies["good"]
    assert (good.distribution, good.version, good.after) == ("planc-goodplugin", "1.2.3", ("ddp",))
    # Without an `enabled` rule a plugin takes part when the plan names it.
    assert not good.enabled(plan(), layout(dp=8))
    with_use = plan(uses=[("good", {"rank": 2})])
    assert good.enabled(with_use, layout(dp=8))
    assert good.options_for(with_use).rank == 2
    assert [s.name for s in reg.active(with_use, layout(dp=8))] == ["ddp", "good"]


def test_unknown_option_gets_did_you_mean(install_plugin):
    install_plugin("planc-goodplugin", "1.0", {"good": good_plugin("good")})
    reg = load_registry(refresh=True)
    with pytest.raises(SpecError) as info:
        reg.strategies["good"].options_for(plan(uses=[("good", {"rnk": 2})]))
    (issue,) = info.value.issues
    assert issue.path == ("uses", 0, "options", "rnk")
    assert "unknown option 'rnk'" in issue.message and "did you mean 'rank'" in issue.hint


def test_bad_option_value_names_the_option(install_plugin):
    install_plugin("planc-goodplugin", "1.0", {"good": good_plugin("good")})
    reg = load_registry(refresh=True)
    with pytest.raises(SpecError) as info:
        reg.strategies["good"].options_for(plan(uses=[("good", {"rank": "lots"})]))
    assert info.value.issues[0].path == ("uses", 0, "options", "rank")
    assert "Rank of the thing" in info.value.issues[0].hint


def test_a_plugin_that_fails_to_import_is_reported_and_skipped(install_plugin):
    install_plugin("planc-broken", "0.1", {"broken": "import not_a_module_anywhere\n"})
    reg = load_registry(refresh=True)
    assert "broken" not in reg.strategies
    (problem,) = problems_of(reg, "broken")
    assert (problem.distribution, problem.version, problem.skipped) == ("planc-broken", "0.1", True)
    assert "ModuleNotFoundError" in problem.message and "not_a_module_anywhere" in problem.message
    assert BUILTINS <= set(reg.strategies)  # planc keeps working


def test_a_plugin_raising_at_import_is_reported(install_plugin):
    install_plugin("planc-raiser", "0.1", {"raiser": "raise RuntimeError('boom at import')\n"})
    (problem,) = problems_of(load_registry(refresh=True), "raiser")
    assert "RuntimeError: boom at import" in problem.message


def test_wrong_api_version(install_plugin):
    install_plugin(
        "planc-future", "9.0", {"future": good_plugin("future").replace("API_VERSION = 1", "API_VERSION = 2")}
    )
    reg = load_registry(refresh=True)
    assert "future" not in reg.strategies
    (problem,) = problems_of(reg, "future")
    assert "API_VERSION = 2" in problem.message and f"version {api.API_VERSION}" in problem.message
    assert problem.distribution == "planc-future"


@pytest.mark.parametrize(
    "misspelling, hook", [("aply", "apply"), ("Option", "Options"), ("enable", "enabled"), ("after", "AFTER")]
)
def test_misspelled_hook_is_reported(install_plugin, misspelling, hook):
    source = good_plugin("typo")
    if misspelling == "aply":
        source = source.replace("def apply(", "def aply(")
    elif misspelling == "Option":
        source = source.replace("class Options(", "class Option(")
    elif misspelling == "enable":
        source += "\ndef enable(plan, layout):\n    return True\n"
    else:
        source = source.replace("AFTER = ", "after = ")
    install_plugin("planc-typo", "1.0", {"typo": source})
    reg = load_registry(refresh=True)
    assert "typo" not in reg.strategies
    messages = " ".join(p.message for p in problems_of(reg, "typo"))
    assert f"unknown attribute '{misspelling}'" in messages and f"did you mean '{hook}'" in messages


def test_helpers_and_imports_are_not_mistaken_for_hooks(install_plugin):
    source = good_plugin("helpers") + (
        "import json\nfrom typing import Literal\n"
        "def check_options(x):\n    return x\n"
        "def applied_count():\n    return 0\n"
        "DEFAULT_RANK = 4\n"
    )
    install_plugin("planc-helpers", "1.0", {"helpers": source})
    reg = load_registry(refresh=True)
    assert "helpers" in reg.strategies, [str(p) for p in reg.problems]


def test_name_must_match_entry_point(install_plugin):
    install_plugin("planc-liar", "1.0", {"liar": good_plugin("somebody_else")})
    (problem,) = problems_of(load_registry(refresh=True), "liar")
    assert "differs from its entry-point name" in problem.message


def test_missing_required_attribute(install_plugin):
    install_plugin("planc-bare", "1.0", {"bare": 'NAME = "bare"\nAPI_VERSION = 1\n'})
    (problem,) = problems_of(load_registry(refresh=True), "bare")
    assert "DESCRIPTION" in problem.message and "apply" in problem.message


def test_builtin_wins_a_name_collision(install_plugin):
    install_plugin("planc-evil", "6.6.6", {"ddp": good_plugin("ddp")})
    reg = load_registry(refresh=True)
    assert reg.strategies["ddp"].distribution == "planc"
    (problem,) = problems_of(reg, "ddp")
    assert problem.distribution == "planc-evil" and "built-in" in problem.message


def test_two_plugins_with_one_name_are_both_skipped(install_plugin):
    install_plugin("planc-one", "1.0", {"twin": good_plugin("twin")})
    install_plugin("planc-two", "2.0", {"twin": good_plugin("twin")})
    reg = load_registry(refresh=True)
    assert "twin" not in reg.strategies
    assert {p.distribution for p in problems_of(reg, "twin")} == {"planc-one", "planc-two"}
    assert all("both are skipped" in p.message for p in problems_of(reg, "twin"))


def test_after_cycle_is_reported_and_its_plugins_skipped(install_plugin):
    install_plugin(
        "planc-cycle",
        "1.0",
        {"alpha": good_plugin("alpha", after=("beta",)), "beta": good_plugin("beta", after=("alpha",))},
    )
    reg = load_registry(refresh=True)
    assert not {"alpha", "beta"} & set(reg.strategies)
    messages = [p.message for p in reg.problems if p.name in ("alpha", "beta")]
    assert messages and all("cycle" in m for m in messages)
    assert any("alpha -> beta -> alpha" in m or "beta -> alpha -> beta" in m for m in messages)
    assert BUILTINS <= set(reg.strategies)


def test_active_reports_a_cycle_among_active_strategies(install_plugin):
    # A cycle that only closes through a built-in's AFTER: the loader drops the plugin.
    install_plugin(
        "planc-loop",
        "1.0",
        {
            "loopy": good_plugin("loopy", after=("fsdp",)).replace(
                "def apply", "def enabled(plan, layout):\n    return True\n\ndef apply"
            )
        },
    )
    reg = load_registry(refresh=True)
    # Make the built-in fsdp come after loopy too, on a copy, to exercise active()'s own guard.
    import types
    from dataclasses import replace

    fake = types.ModuleType("fsdp_copy")
    fake.__dict__.update(vars(reg.strategies["fsdp"].module))
    fake.AFTER = ("loopy",)
    reg.strategies["fsdp"] = replace(reg.strategies["fsdp"], module=fake)
    with pytest.raises(PlanError) as info:
        reg.active(plan(), layout(dp=8, zero=3))
    assert "cycle" in info.value.message


def test_unknown_after_name_is_a_warning(install_plugin):
    install_plugin("planc-lost", "1.0", {"lost": good_plugin("lost", after=("ddpp",))})
    reg = load_registry(refresh=True)
    assert "lost" in reg.strategies
    (problem,) = problems_of(reg, "lost")
    assert not problem.skipped and "'ddpp'" in problem.message and "did you mean 'ddp'" in problem.message


def test_planc_plugins_restricts_loading(install_plugin, monkeypatch):
    install_plugin("planc-goodplugin", "1.0", {"good": good_plugin("good")})
    monkeypatch.setenv(api.RESTRICT_ENV, "ddp, good,fsdpp")
    reg = load_registry(refresh=True)
    assert set(reg.strategies) == {"ddp", "good"}
    (problem,) = problems_of(reg, "fsdpp")
    assert "did you mean 'fsdp'" in problem.message


def test_builtin_composition_order():
    reg = load_registry(refresh=True)
    everything = layout(tp=2, pp=2, dp=2, zero=3, recompute="full", schedule="1f1b", sequence_parallel=True)
    assert [s.name for s in reg.active(plan(precision="bf16"), everything)] == [
        "pipeline",
        "tensor_parallel",
        "recompute",
        "bf16",
        "fsdp",
    ]
    ddp = layout(tp=2, dp=4, zero=0)
    assert [s.name for s in reg.active(plan(), ddp)] == ["tensor_parallel", "ddp"]
    # The whole built-in graph sorts to the documented order.
    import networkx as nx

    from planc.strategies.registry import composition_graph

    graph = composition_graph(reg.strategies[n] for n in BUILTIN_ORDER)
    assert list(nx.lexicographical_topological_sort(graph, key=BUILTIN_ORDER.index)) == list(BUILTIN_ORDER)


@pytest.mark.parametrize(
    "lay, active",
    [
        (dict(dp=8), {"ddp"}),
        (dict(dp=8, zero=1), {"zero1"}),
        (dict(dp=8, zero=2), {"fsdp"}),
        (dict(dp=8, zero=3, recompute="selective"), {"fsdp", "recompute"}),
        (dict(tp=8), {"tensor_parallel"}),
        (dict(pp=8, schedule="1f1b", micro_batch=1), {"pipeline"}),
        (
            dict(tp=2, pp=2, dp=2, zero=1, schedule="interleaved", virtual_stages=2, micro_batch=1),
            {"tensor_parallel", "pipeline", "zero1"},
        ),
    ],
)
def test_enabled_follows_the_layout(lay, active):
    reg = load_registry(refresh=True)
    assert {s.name for s in reg.active(plan(), layout(**lay))} == active


def test_registry_check_reports_use_blocks():
    reg = load_registry(refresh=True)
    issues = reg.check(plan(uses=[("dpp", {}), ("fsdp", {"reshard_after_forward": False})]), layout(dp=8, zero=3))
    messages = [(i.path, i.message) for i in issues]
    assert any(path == ("uses", 0, "name") and "unknown strategy plugin 'dpp'" in m for path, m in messages)
    assert any("contradicts layout zero = 3" in m for _, m in messages)
    unused_plan = plan(uses=[("ddp", {"bucket": Quantity.of(1, "MB")})])
    assert not reg.check(unused_plan, layout(dp=8, zero=3))  # a warning, not an error:
    (warning,) = reg.unused_uses(unused_plan, layout(dp=8, zero=3))
    assert "'ddp' does not take part" in warning


@pytest.mark.dist
def test_loading_the_registry_does_not_import_torch():
    code = (
        "import sys; from planc.strategies.registry import load_registry; reg = load_registry(); "
        "assert len(reg.strategies) >= 7, reg.problems; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_plugin_hook_that_raises_is_named_in_a_plan_error(install_plugin):
    source = good_plugin("crashy") + "\ndef enabled(plan, layout):\n    raise KeyError('oops')\n"
    install_plugin("planc-crashy", "0.3", {"crashy": source})
    reg = load_registry(refresh=True)
    with pytest.raises(PlanError) as info:
        reg.active(plan(uses=[("crashy", {})]), layout(dp=8))  # a plan that names it; else it is skipped
    assert "'crashy' (from planc-crashy 0.3) failed in enabled() at " in info.value.message
    assert "remove the `use crashy` block" in info.value.hint


def test_steps_before_a_plugin_works_as_priced_come_from_its_steady_after_hook(install_plugin):
    # A plugin without the hook, and every built-in, works as priced from the first step; one that
    # declares steps (a compressor's uncompressed start) is listed with them; anything but a whole
    # number of 0 or more is the plugin's error, named as a hook's exception is.
    warm = good_plugin("warm") + "\ndef steady_after(plan, options):\n    return 3 * options.rank\n"
    bad = good_plugin("bad") + "\ndef steady_after(plan, options):\n    return 2.5\n"
    install_plugin("planc-warm", "0.1", {"warm": warm, "good": good_plugin("good"), "bad": bad})
    reg = load_registry(refresh=True)
    assert reg.steady_after(plan(uses=[("good", {})]), layout(dp=8)) == {}
    assert reg.steady_after(plan(uses=[("warm", {"rank": 2}), ("good", {})]), layout(dp=8)) == {"warm": 6}
    with pytest.raises(PlanError) as info:
        reg.steady_after(plan(uses=[("bad", {})]), layout(dp=8))
    assert "steady_after() returned 2.5, not a whole number of steps" in info.value.message


def test_a_steady_after_that_is_not_a_function_breaks_the_contract(install_plugin):
    install_plugin("planc-odd", "0.1", {"odd": good_plugin("odd") + "\nsteady_after = 4\n"})
    reg = load_registry(refresh=True)
    assert "odd" not in reg.strategies
    assert any("'steady_after' must be a function" in p.message for p in problems_of(reg, "odd"))


def test_a_use_block_naming_a_plugin_that_failed_to_load_says_why(install_plugin):
    install_plugin("planc-broken", "0.1", {"broken": "import not_a_module_anywhere\n"})
    reg = load_registry(refresh=True)
    used = plan(uses=[("broken", {})])
    for issues in (reg.validate_uses(used), reg.check(used, layout(dp=8))):
        (issue,) = issues
        assert issue.path == ("uses", 0, "name")
        assert "'broken' is installed but was not loaded" in issue.message
        assert "not_a_module_anywhere" in issue.message and "planc plugins" in issue.hint


def test_a_layout_needing_a_builtin_left_out_by_planc_plugins_is_refused(monkeypatch):
    monkeypatch.setenv(api.RESTRICT_ENV, "ddp")
    reg = load_registry(refresh=True)
    three_d = layout(tp=2, pp=2, dp=2, schedule="1f1b")
    (issue,) = reg.check(plan(), three_d)
    assert (
        "needs the built-in strategies 'pipeline' (more than one pipeline stage) and 'tensor_parallel'" in issue.message
    )
    assert issue.hint == "add pipeline,tensor_parallel to PLANC_PLUGINS, or unset it"
    assert not reg.check(plan(), layout(dp=8))  # what ddp alone builds is fine
    with pytest.raises(PlanError, match="which PLANC_PLUGINS leaves out"):
        reg.require(plan(), three_d)


def test_the_planner_only_chooses_layouts_the_used_plugins_accept():
    from planc.planner import choose, search

    # powersgd is a DDP communication hook: it refuses ZeRO-2/3 (FSDP). Llama 2 13B's model states
    # do not fit 8 A100s under DDP or ZeRO-1 (16 and 4 + 12/8 bytes per parameter: 195 and 110 GiB),
    # so without the refusal ZeRO-2 would be the simplest fit; with it, the planner must go on to TP.
    used = build_plan(
        {
            "model": {"preset": "llama2-13b"},
            "hardware": {"device": "A100-80GB", "per_node": 8},
            "train": {"global_batch": 64},
            "uses": [{"name": "powersgd", "options": {}}],
        }
    )
    choice = choose(used, load_registry())
    assert choice.layout.dp > 1 and choice.layout.zero in (0, 1) and choice.layout.tp > 1
    assert all(c.layout.zero in (0, 1) for c in search(used, load_registry()).fitting if c.layout.dp > 1)
    from planc.explain.words import rejection_reason

    reasons = {r.strategy: rejection_reason(r) for r in choice.rejected}
    for rung in ("ZeRO-2", "ZeRO-3 (FSDP)"):
        assert reasons[rung].startswith("refused by use powersgd: PowerSGD is a DistributedDataParallel")
    assert not load_registry(refresh=True).check(used, choice.layout)
