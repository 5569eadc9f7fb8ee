"""The eager op counts of planc.cost.dispatch are planc's program as it runs under this torch."""

from __future__ import annotations

import importlib.util

import pytest

from planc.cost.dispatch import BLOCK_OPS, DTENSOR_OPS, DTENSOR_OPS_AUTOCAST


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


@pytest.mark.dist
def test_step_op_counts_match_a_recount(root):
    """The optimizer's ops per parameter tensor, the ops per micro-batch outside the blocks and
    the fixed ops per step, recounted on the real training loop (one gloo process)."""
    import os
    import subprocess
    import sys

    from planc.cost import dispatch

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": "29671"}
    out = subprocess.run(
        [sys.executable, "tools/count_eager_ops.py", "--step-only"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    counted = {
        name.strip(): float(value) for name, value in (line.split("=") for line in out.splitlines() if "=" in line)
    }
    # 0 with the fused optimizer: an op or two per block would still be within half an op per tensor
    assert counted["OPS_PER_PARAMETER_TENSOR"] == pytest.approx(dispatch.OPS_PER_PARAMETER_TENSOR, rel=0.1, abs=0.5)
    assert counted["MICRO_BATCH_OPS"] == pytest.approx(dispatch.MICRO_BATCH_OPS, rel=0.1)
    assert counted["STEP_OPS"] == pytest.approx(dispatch.STEP_OPS, rel=0.15)


@pytest.mark.dist(launches=False)  # a tool in a process of its own: torch's fake process group, 2 ranks
def test_dtensor_op_counts_match_a_recount(root):
    """The ops that reach DTensor's dispatch under tensor parallelism, recounted (about 5 s)."""
    import ast
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "tools/count_eager_ops.py", "--dtensor"],
        cwd=root,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    tables: dict = {}
    for line in out.splitlines():
        if line.endswith("= {"):
            current = tables.setdefault(line.split("=")[0].strip(), {})
        elif line.startswith("    ("):
            key, value = line.strip().rstrip(",").split(": ")
            current[ast.literal_eval(key)] = ast.literal_eval(value)
    for name, table in (("DTENSOR_OPS", DTENSOR_OPS), ("DTENSOR_OPS_AUTOCAST", DTENSOR_OPS_AUTOCAST)):
        for key, counts in table.items():
            assert tables[name][key] == pytest.approx(counts, rel=0.1), (name, key)
