"""From the syntax tree to ``build_plan``'s raw data, and spec issues back to source positions."""

import pytest

from planc.dsl import load_plan_text, parse
from planc.dsl.lower import build, locate, lower
from planc.errors import PlanError, PlanErrors
from planc.spec import SpecIssue
from planc.strategies.registry import load_registry
from planc.units import Quantity

SOURCE = """model "m" {
  layers = 2
}
hardware {
  device = "cpu"
  memory = 8 GiB
}
use fsdp { reshard = true  sizes = [1 MiB, 2] }
"""


def test_raw_data_and_locations():
    lowered = lower(parse(SOURCE, "x.plan"))
    assert lowered.raw == {
        "model": {"name": "m", "layers": 2},
        "hardware": {"device": "cpu", "memory": Quantity(8 * 2**30, "bytes", "8 GiB")},
        "uses": [{"name": "fsdp", "options": {"reshard": True, "sizes": [Quantity(2**20, "bytes", "1 MiB"), 2]}}],
    }
    at = lambda path: (lowered.values[path].line, lowered.values[path].col)  # noqa: E731
    assert at(("model",)) == (1, 1)
    assert at(("model", "name")) == (1, 7)
    assert at(("model", "layers")) == (2, 12)
    assert at(("hardware", "memory")) == (6, 12)
    assert at(("uses", 0, "name")) == (8, 5)
    assert at(("uses", 0, "options", "sizes")) == (8, 36)
    assert (lowered.keys[("hardware", "memory")].line, lowered.keys[("hardware", "memory")].col) == (6, 3)


@pytest.mark.parametrize(
    "path,message,where",
    [
        (("hardware", "memory"), "bad memory", (6, 12)),  # the value
        (("hardware", "memory"), "unknown key 'memory'", (6, 3)),  # about the key: the key
        (("hardware", "nodes"), "not written", (4, 1)),  # not in the file: the block header
        (("uses", 0, "options", "rank"), "x", (8, 5)),  # longest prefix that exists
        (("layout", "tp"), "no layout block", None),  # nothing of it in the file: file:1:1
        ((), "the plan as a whole", None),
    ],
)
def test_locate_falls_back_along_the_path(path, message, where):
    lowered = lower(parse(SOURCE, "x.plan"))
    error = locate(SpecIssue(path, message, "a hint"), lowered)
    if where is None:
        assert (error.location.line, error.location.col) == (1, 1)
        assert str(error) == f"x.plan:1:1: error: {message}\n  hint: a hint"
    else:
        assert (error.location.line, error.location.col) == where


def test_preset_issues_point_at_the_preset():
    text = (
        'model { preset = "gpt2" }\nhardware { device = "A100-80GB" }\ntrain { global_batch = 8 }\nlayout { tp = 8 }\n'
    )
    with pytest.raises(PlanError) as caught:
        load_plan_text(text, "x.plan", strategies=load_registry())
    # gpt2 has 12 heads: the issue is about tp, and points at tp (the preset's heads are not written).
    assert str(caught.value).startswith("x.plan:4:15: error: tp = 8 does not divide heads = 12")


def test_issue_about_a_key_the_preset_set_points_at_the_preset():
    text = 'model { preset = "gpt2"  kv_heads = 5 }\nhardware { device = "A100-80GB" }\ntrain { global_batch = 8 }\n'
    with pytest.raises(PlanError) as caught:
        load_plan_text(text, "x.plan", strategies=load_registry())
    assert str(caught.value).startswith("x.plan:1:37: error: kv_heads = 5 does not divide heads = 12")


def test_label_and_name_key_conflict():
    with pytest.raises(PlanErrors) as caught:
        load_plan_text(
            'model "a" { name = "b" }\nhardware { device = "cpu" }\ntrain { global_batch = 1 }',
            "x",
            strategies=load_registry(),
        )
    (conflict,) = [e for e in caught.value.errors if "set twice" in e.message]
    assert conflict.message == "'name' is set twice: by the block header and by this key"
    assert (conflict.location.line, conflict.location.col) == (1, 13)
    assert conflict.hint == 'line 1 already says model "a"; keep one of the two'


def test_all_problems_of_a_file_are_reported_together_in_source_order():
    text = (
        'model { preset = "gpt2"  mlp = relu }\n'
        'hardwre { device = "cpu" }\n'
        "train { global_batch = 0  precision = fp8 }\n"
    )
    with pytest.raises(PlanErrors) as caught:
        load_plan_text(text, "x.plan", strategies=load_registry())
    assert [(e.location.line, e.location.col) for e in caught.value.errors] == [(1, 32), (2, 1), (3, 24), (3, 39)]
    # the unknown block 'hardwre' is not reported a second time as "the plan has no hardware block"
    assert not any("no hardware block" in e.message for e in caught.value.errors)


def test_plugin_options_get_quantities_in_base_units_lists_included():
    text = (
        'model { preset = "gpt2" }\nhardware { device = "cpu" }\ntrain { global_batch = 8 }\n'
        "use ddp { bucket = 25 MB  sizes = [1 KiB, 2]  mode = fast }\n"
    )
    plan = build(parse(text, "x.plan"), known_strategies={"ddp"})  # lowering only: ddp takes no such options
    assert plan.uses[0].options == {"bucket": 25e6, "sizes": [1024.0, 2], "mode": "fast"}
    assert '"sizes": [\n' in plan.to_json()  # plain JSON numbers, not objects


def test_use_options_are_validated_by_the_strategy_and_located():
    text = (
        'model { preset = "gpt2" }\nhardware { device = "cpu" }\ntrain { global_batch = 8 }\n'
        "use ddp { buckt = 25 MB }\n"
    )
    with pytest.raises(PlanErrors) as caught:
        load_plan_text(text, "x.plan", strategies=load_registry())
    (error,) = caught.value.errors
    assert error.message == "unknown option 'buckt' for strategy 'ddp'"
    assert error.location.line == 4 and "did you mean 'bucket'" in error.hint


def test_a_flood_of_errors_is_cut_short():
    keys = "\n".join(f"  k{i} = {i}" for i in range(60))
    with pytest.raises(PlanErrors) as caught:
        load_plan_text(
            f'model {{ preset = "gpt2" }}\nhardware {{ device = "cpu" }}\ntrain {{ global_batch = 8\n{keys}\n}}\n',
            "x",
            strategies=load_registry(),
        )
    errors = caught.value.errors
    assert len(errors) == 51 and all(e.message.startswith("unknown key 'k") for e in errors[:50])
    assert errors[-1].message == "... and 10 more problems in this file" and errors[-1].location is None
