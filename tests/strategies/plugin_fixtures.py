"""Fixtures that install throw-away strategy plugins as real distributions.

Each plugin is a ``<name>-<version>.dist-info`` directory (METADATA + entry_points.txt) next to
its module, in a temporary directory put on ``sys.path`` -- exactly what pip leaves behind, so
``importlib.metadata.entry_points`` finds it the way it finds an installed package.
"""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from planc.spec import Layout, build_plan
from planc.strategies import registry

GOOD_PLUGIN = '''
"""A minimal, valid strategy plugin."""
from pydantic import BaseModel, ConfigDict

NAME = "{name}"
API_VERSION = 1
DESCRIPTION = "test plugin {name}"
AFTER = {after!r}


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    rank: int = 4
    """Rank of the thing."""


def apply(job, options):
    job.applied.append(NAME)
'''


@pytest.fixture
def install_plugin(tmp_path, monkeypatch):
    """``install_plugin(dist, version, {entry_name: module_source})`` -> registers the entry points."""
    monkeypatch.syspath_prepend(str(tmp_path))
    created_modules = []

    def install(distribution: str, version: str, entries: dict[str, str]) -> None:
        info = tmp_path / f"{distribution.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
        lines = ["[planc.strategies]"]
        for entry, source in entries.items():
            module = f"{distribution.replace('-', '_')}_{entry}"
            (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
            lines.append(f"{entry} = {module}")
            created_modules.append(module)
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        importlib.invalidate_caches()
        registry.clear_cache()

    yield install
    for module in created_modules:
        sys.modules.pop(module, None)
    importlib.invalidate_caches()
    registry.clear_cache()


def good_plugin(name: str, after: tuple = ()) -> str:
    return GOOD_PLUGIN.format(name=name, after=after)


def tiny_plan(uses=(), precision="fp32", world=8):
    """An 8-layer CPU plan on ``world`` processes with the strategy ``uses`` [(name, options)]."""
    return build_plan(
        {
            "model": {"layers": 8, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32},
            "hardware": {"device": "cpu", "per_node": world},
            "train": {"global_batch": 16, "precision": precision},
            "uses": [{"name": n, "options": o} for n, o in uses],
        }
    )


def tiny_layout(**fields):
    """A layout with one process in every dimension unless ``fields`` say otherwise."""
    values = dict(tp=1, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=1)
    values.update(fields)
    return Layout(**values)
