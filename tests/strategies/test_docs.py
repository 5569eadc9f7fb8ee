"""Every built-in strategy and each of its options is documented (datasette's hook-doc test)."""

from __future__ import annotations

import re

from planc.strategies.registry import load_registry


def test_every_builtin_and_option_is_documented(root):
    text = (root / "docs" / "strategies.md").read_text()
    sections = set(re.findall(r"^## (\w+)$", text, flags=re.MULTILINE))
    for name, strategy in load_registry(refresh=True).strategies.items():
        if not strategy.builtin:
            continue
        assert name in sections, f"docs/strategies.md has no '## {name}' section"
        section = text.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
        for option in strategy.options_model.model_fields:
            assert f"`{option}`" in section, f"option '{option}' of '{name}' is not documented in its section"


def test_plugin_contract_is_documented(root):
    text = (root / "docs" / "plugins.md").read_text()
    from planc.strategies import api

    for attribute in api.REQUIRED_ATTRIBUTES + api.OPTIONAL_ATTRIBUTES:
        assert f"`{attribute}" in text, f"docs/plugins.md does not describe '{attribute}'"
    assert api.RESTRICT_ENV in text and api.ENTRY_POINT_GROUP in text
