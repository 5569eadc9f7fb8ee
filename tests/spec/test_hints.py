"""Hints that lead somewhere: a suggested value meets every rule at once, a misspelled name gets
the thing meant (not a name that merely looks alike), and a plugin that refuses every layout is
found by ``planc check`` at its ``use`` line."""

import re

import pytest

from planc.errors import PlanErrors, did_you_mean
from planc.spec import SpecError, build_plan
from planc.spec.model_hints import model_preset_hint
from planc.spec.presets import HARDWARE_PRESETS, MODEL_PRESETS


def _plan(tp, heads=20, kv_heads=5, per_node=8, nodes=1):
    return {
        "model": {"layers": 4, "hidden": 1280, "heads": heads, "kv_heads": kv_heads, "ffn": 5120, "vocab": 32000},
        "hardware": {"device": "A100-80GB", "nodes": nodes, "per_node": per_node},
        "train": {"global_batch": 64},
        "layout": {"tp": tp},
    }


def _tp_issues(raw):
    try:
        build_plan({**raw, "model": {**raw["model"], "seq_len": 1024}})
    except SpecError as error:
        return [i for i in error.issues if i.path[:2] == ("layout", "tp") or i.path == ("layout",)]
    return []


@pytest.mark.parametrize(
    "heads, kv_heads, per_node, tp",
    [
        (20, 5, 8, 4),  # the issue's case: 5 divides kv_heads but not per_node
        (20, 5, 8, 5),
        (20, 20, 8, 8),  # 8 does not divide 20; 10 would, but exceeds per_node
        (20, 20, 8, 16),
        (12, 12, 8, 8),  # GPT-2: 6 divides 12 but not per_node = 8
        (12, 12, 4, 3),
        (32, 8, 8, 16),
        (40, 40, 8, 16),
    ],
)
def test_following_a_tp_hint_never_leads_to_another_tp_error(heads, kv_heads, per_node, tp):
    issues = _tp_issues(_plan(tp, heads, kv_heads, per_node))
    assert issues, "the written tp is wrong"
    hint = " ".join(i.hint or "" for i in issues)
    suggested = re.search(r"use tp = (\d+)", hint)
    if suggested is None:
        # No tp > 1 works: the hint says so and names the key to change instead.
        assert "no tp > 1" in hint and "change" in hint, hint
        legal = [t for t in range(2, per_node + 1) if not _tp_issues(_plan(t, heads, kv_heads, per_node))]
        assert legal == []
        return
    assert _tp_issues(_plan(int(suggested.group(1)), heads, kv_heads, per_node)) == []
    others = re.search(r"\(so does? ([\d, ]+)\)", hint)
    for also in others.group(1).split(", ") if others else []:
        assert _tp_issues(_plan(int(also), heads, kv_heads, per_node)) == []


def test_heads_20_kv_heads_5_on_8_devices_says_no_tp_can_and_names_kv_heads():
    (issue,) = _tp_issues(_plan(4))
    # tp | kv_heads = 5 and tp | per_node = 8: gcd(5, 8) = 1, so only tp = 1.
    assert "e.g. 5" not in issue.hint and "no tp > 1 divides kv_heads = 5 and per_node = 8" in issue.hint
    assert "change kv_heads" in issue.hint


def test_tp_8_with_20_heads_is_not_told_a_value_above_per_node():
    (issue,) = _tp_issues(_plan(8, kv_heads=20))
    assert "10" not in issue.hint and "use tp = 4" in issue.hint  # 4 | 20, 4 | 8; 10 > per_node


@pytest.mark.parametrize(
    "written, meant",
    [
        ("H100", "H100-SXM"),
        ("h100", "H100-SXM"),
        ("h100-sxm", "H100-SXM"),
        ("mi300", "MI300X"),
        ("a100-80gb", "A100-80GB"),
    ],
)
def test_a_device_name_gets_the_preset_it_abbreviates(written, meant):
    hint = did_you_mean(written, HARDWARE_PRESETS)
    assert hint == f"did you mean '{meant}'?"


def test_a_suggestion_never_changes_a_number():
    assert did_you_mean("H100", HARDWARE_PRESETS) != "did you mean 'H200'?"
    assert did_you_mean("B100", HARDWARE_PRESETS) is None  # not B200: another chip
    assert did_you_mean("lama3-8b", MODEL_PRESETS) == "did you mean 'llama3-8b'?"  # a typo keeps its numbers
    assert did_you_mean("A100", HARDWARE_PRESETS) == "did you mean 'A100-40GB' or 'A100-80GB'?"


def test_an_unknown_model_of_a_known_family_lists_that_family_not_a_lookalike():
    hint = model_preset_hint("llama3.2-11b")  # the vision model: not one of planc's
    assert "llama2-13b" not in hint
    assert "llama3-8b, llama3-70b, llama3-405b, llama3.1-8b" in hint and "from" in hint
    assert "one of:" in model_preset_hint("falcon-40b")  # no family: every preset


POWERSGD_WITH_FSDP = """model { preset = "gpt2" }
hardware { device = "A100-80GB"  per_node = 8 }
train { global_batch = 64 }
layout { zero = 3 }
use powersgd { rank = 4 }
"""


def test_a_plugin_that_refuses_every_layout_is_an_error_at_its_use_line():
    from planc.dsl.load import load_plan_text
    from planc.strategies.registry import load_registry

    with pytest.raises(PlanErrors) as caught:
        load_plan_text(POWERSGD_WITH_FSDP, "x.plan", strategies=load_registry())
    (error,) = caught.value.errors
    assert error.location is not None and error.location.line == 5  # the use block
    assert "powersgd" in error.message and "zero = 3 uses FSDP" in error.message
    # The same plan with zero left to the planner is fine (DDP or ZeRO-1 take the hook).
    load_plan_text(POWERSGD_WITH_FSDP.replace("zero = 3", "zero = auto"), "x.plan", strategies=load_registry())


def test_a_heads_hint_keeps_grouped_query_attention_legal():
    # hidden = 1000 has divisors ... 8, 10, 20 ...; kv_heads = 4 divides 8 and 20 but not 10 (the
    # divisor nearest 12 a hint blind to kv_heads would give), so the nearest legal heads is 8.
    model = {"layers": 2, "hidden": 1000, "heads": 12, "kv_heads": 4, "vocab": 256, "seq_len": 64}
    raw = {"model": model, "hardware": {"device": "cpu"}, "train": {"global_batch": 4}}
    with pytest.raises(SpecError) as caught:
        build_plan(raw)
    (issue,) = [i for i in caught.value.issues if i.path == ("model", "heads")]
    suggested = int(re.search(r"e\.g\. (\d+)", issue.hint).group(1))
    assert suggested == 8
    build_plan({**raw, "model": {**model, "heads": suggested}})  # no issue left


def _pp_issues(pp, layers=32, nodes=1, per_node=8, tp="auto"):
    raw = {
        "model": {"layers": layers, "hidden": 512, "heads": 8, "vocab": 1024, "seq_len": 128},
        "hardware": {"device": "A100-80GB", "nodes": nodes, "per_node": per_node},
        "train": {"global_batch": 64},
        "layout": {"pp": pp, "tp": tp},
    }
    try:
        build_plan(raw)
    except SpecError as error:
        return [i for i in error.issues if i.path in (("layout", "pp"), ("layout",))]
    return []


@pytest.mark.parametrize(
    "pp, layers, nodes, per_node, tp",
    [
        (64, 32, 1, 8, "auto"),  # the audit's case: pp <= 32 was suggested, but 32, 16 and 3 do not divide 8
        (8, 4, 2, 8, "auto"),  # 16 devices, 4 layers: 2 or 4
        (12, 6, 1, 8, 2),  # 8 devices over tp = 2 leave 4 for pp; 6 layers: 2 or 4
        (5, 4, 1, 6, 3),  # 6 devices over tp = 3 leave 2: pp = 2
    ],
)
def test_following_a_pp_hint_never_leads_to_another_pp_error(pp, layers, nodes, per_node, tp):
    issues = _pp_issues(pp, layers, nodes, per_node, tp)
    hint = " ".join(i.hint or "" for i in issues if i.path == ("layout", "pp"))
    assert "use pp <=" not in hint, hint
    suggested = re.search(r"use pp = (\d+)", hint)
    assert suggested, hint
    assert _pp_issues(int(suggested.group(1)), layers, nodes, per_node, tp) == []
    others = re.search(r"\(so does? ([\d, ]+)\)", hint)
    for also in others.group(1).split(", ") if others else []:
        assert _pp_issues(int(also), layers, nodes, per_node, tp) == []


def test_pp_hint_on_the_audit_case_names_the_divisors_of_8():
    (issue,) = [i for i in _pp_issues(64) if i.path == ("layout", "pp")]
    # Divisors of 8 above 1 and at most 32 layers: 2, 4, 8; the nearest to 64 is 8.
    assert "use pp = 8" in issue.hint and "so do 2, 4" in issue.hint


def test_no_pp_works_says_so():
    # 6 devices over tp = 3 leave 2 for pp, but the model has one layer: only pp = 1.
    (issue,) = [i for i in _pp_issues(2, layers=1, per_node=6, tp=3) if i.path == ("layout", "pp")]
    assert "no pp > 1 divides the 2 devices" in issue.hint and "use pp =" not in issue.hint


def _model_issues(model):
    raw = {"model": {"vocab": 256, "seq_len": 64, "layers": 2, **model}, "hardware": {"device": "cpu"}}
    try:
        build_plan({**raw, "train": {"global_batch": 4}})
    except SpecError as error:
        return error.issues
    return []


@pytest.mark.parametrize(
    "model",
    [
        {"hidden": 4095, "heads": 32, "kv_heads": 8, "position": "rope"},  # the audit's case: 4095 is odd
        {"hidden": 4000, "heads": 48, "kv_heads": 8, "position": "rope"},
        {"hidden": 250, "heads": 6, "kv_heads": 6},
        {"hidden": 256, "heads": 6},  # kv_heads left out: it follows heads
        {"hidden": 1000, "heads": 12, "kv_heads": 4},
        {"hidden": 999, "heads": 12, "position": "rope"},
    ],
)
def test_following_a_heads_or_hidden_hint_leads_to_a_valid_model(model):
    (issue,) = _model_issues(model)
    if issue.path == ("model", "heads"):  # a heads value exists: it meets every attention rule
        heads = int(re.search(r"e\.g\. (\d+)", issue.hint).group(1))
        # Multi-head attention (kv_heads = heads): kv_heads follows, as its default does.
        kv = {"kv_heads": heads} if "kv_heads" in model and f"kv_heads = {heads} too" in issue.hint else {}
        assert _model_issues({**model, "heads": heads, **kv}) == []
        return
    # No heads value works: the hint says so and names hidden, with a hidden that keeps heads.
    assert issue.path == ("model", "hidden") and "no value of heads works" in issue.hint
    hidden = int(re.search(r"e\.g\. (\d+) \(", issue.hint).group(1))
    assert _model_issues({**model, "hidden": hidden}) == []
    from planc.legality.rules import divisors

    rope = model.get("position") == "rope"
    kv = model.get("kv_heads", 1) if model.get("kv_heads") != model["heads"] else 1
    assert not [d for d in divisors(model["hidden"]) if d % kv == 0 and not (rope and model["hidden"] // d % 2)]


def test_the_heads_error_points_at_the_written_hidden_not_the_preset():
    from planc.dsl.load import load_plan_text
    from planc.strategies.registry import load_registry

    text = 'model { preset = "llama3-8b" hidden = 4095 }\nhardware { device = "cpu" }\ntrain { global_batch = 4 }\n'
    with pytest.raises(PlanErrors) as caught:
        load_plan_text(text, "x.plan", strategies=load_registry())
    (error,) = caught.value.errors
    assert (error.location.line, error.location.col) == (1, 39)  # hidden's value, not preset's
    assert "e.g. 35" not in error.hint and "change hidden" in error.hint
