"""docs/language.md documents every key the schema accepts, and its generated tables are current."""

import importlib.util
import re

import pytest

from planc.spec import BLOCKS, block_keys
from planc.spec.presets import HARDWARE_PRESETS, MODEL_PRESETS
from planc.strategies.registry import load_registry
from planc.units import UNITS

from .helpers import ROOT

DOC = ROOT / "docs" / "language.md"


def _tables():
    """tools/language_tables.py: the generator of the tables (a docs tool, not part of the package)."""
    spec = importlib.util.spec_from_file_location("language_tables", ROOT / "tools" / "language_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def section(name: str) -> str:
    """The text under the heading ``### `name` `` up to the next heading of that level or above."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"^### `{name}`\n(.*?)(?=^##? |^### )", text, re.DOTALL | re.MULTILINE)
    assert match, f"docs/language.md has no section for the {name} block"
    return match.group(1)


@pytest.mark.parametrize("block", list(BLOCKS))
def test_every_key_is_documented_in_its_block_section(block):
    documented = set(re.findall(r"^\| `(\w+)` \|", section(block), re.MULTILINE))
    missing = set(block_keys(block)) - documented
    assert not missing, f"keys of the {block} block missing from docs/language.md: {sorted(missing)}"


def test_units_and_presets_are_documented():
    text = DOC.read_text(encoding="utf-8")
    for name in [*UNITS, *MODEL_PRESETS, *HARDWARE_PRESETS]:
        assert f"| `{name}` |" in text, name


def test_generated_tables_are_up_to_date():
    text = DOC.read_text(encoding="utf-8")
    assert _tables().update(text) == text, "run: python tools/refresh_docs.py"


def test_the_documented_example_is_a_valid_plan():
    from planc.dsl import load_plan_text

    text = DOC.read_text(encoding="utf-8")
    first_block = re.search(r"```\n(# GPT-3 175B.*?)```", text, re.DOTALL).group(1)
    plan = load_plan_text(first_block, "docs-example.plan", strategies=load_registry())
    assert plan.model.name == "gpt3-175b" and plan.world_size == 1024


def test_the_example_of_a_model_the_presets_do_not_have_is_not_a_preset():
    """docs/language.md's example of "a model the presets do not have" must be a name planc refuses, with its
    family's presets in the hint (it once named llama3.2-1b, which the preset table lists)."""
    from planc.spec import build_plan
    from planc.spec.issues import SpecError

    text = " ".join(DOC.read_text(encoding="utf-8").split())
    name = re.search(
        r"A model the presets do not have gets its family's presets \(`([^`]+)`: the (\w+) presets\)", text
    )
    assert name, "docs/language.md no longer gives an example of a model the presets do not have"
    assert name.group(1) not in MODEL_PRESETS
    with pytest.raises(SpecError) as refused:
        build_plan(
            {"model": {"preset": name.group(1)}, "hardware": {"device": "H100-SXM"}, "train": {"global_batch": 8}}
        )
    assert f"planc's {name.group(2)} presets are" in refused.value.issues[0].hint
