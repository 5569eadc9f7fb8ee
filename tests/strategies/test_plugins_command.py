"""``planc plugins``: the listing, its JSON, and problems shown without failing."""

from __future__ import annotations

import json

from plugin_fixtures import good_plugin

from planc.cli import main


def test_lists_builtins_with_origin_and_options(capsys):
    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert "ddp  (built-in)" in out and "fsdp  (built-in)" in out
    assert "option bucket: bytes, default 25 MB" in out
    assert "option mode: 'full' | 'selective', default from the layout" in out


def test_json_and_problems(install_plugin, capsys):
    install_plugin(
        "planc-extra",
        "2.1",
        {"extra": good_plugin("extra"), "typo": good_plugin("typo").replace("def apply(", "def aply(")},
    )
    assert main(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    extra = next(s for s in data["strategies"] if s["name"] == "extra")
    assert (extra["distribution"], extra["version"], extra["builtin"]) == ("planc-extra", "2.1", False)
    assert extra["options"][0]["name"] == "rank" and extra["options"][0]["default"] == 4
    typo = [p for p in data["problems"] if p["name"] == "typo"]
    assert {p["distribution"] for p in typo} == {"planc-extra"}
    assert any("did you mean 'apply'" in p["message"] for p in typo)

    assert main(["plugins"]) == 0  # a broken plugin never breaks planc
    out = capsys.readouterr().out
    assert "extra  (planc-extra 2.1)" in out
    assert "typo (from planc-extra 2.1) [skipped]" in out
    assert main(["plugins", "--strict"]) == 1
