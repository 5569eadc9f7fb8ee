"""The eager op counts of planc.cost.dispatch are planc's program as it runs under this torch."""

from __future__ import annotations

import importlib.util

import pytest

from planc.cost.dispatch import BLOCK_OPS


def _counter():
    spec = importlib.util.spec_from_file_location("count_eager_ops", "tools/count_eager_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("key", [("layernorm", "gelu", "learned"), ("rmsnorm", "swiglu", "rope")])
def test_block_op_counts_match_a_recount(root, key, monkeypatch):
    monkeypatch.chdir(root)
    # A new torch may add or remove an op or two; a table more than 10% off needs recounting
    # (python tools/count_eager_ops.py).
    assert _counter().block_ops(*key) == pytest.approx(BLOCK_OPS[key], rel=0.1)
