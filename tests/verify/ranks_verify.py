"""The ranks' side of tests/verify/test_verify_dist.py: train each case 4 steps under planc verify's probe.

    run_ranks("tests/verify/ranks_verify.py:measure", 2, cases)

``cases``: ``[{"plan": Plan JSON, "layout": Layout fields, "out_dir": str, "unmeasured": int}]``.
Each case builds its job through :func:`planc.runtime.compose.compose` (as the emitted program's
strategy calls do) and trains with ``PLANC_VERIFY=1``, so every rank writes
``out_dir/verify/rank<R>.json``: ``unmeasured`` steps first (``PLANC_VERIFY_UNMEASURED``, as
``planc verify`` sets it for a strategy that works as priced only after some steps), then 4.
"""

from __future__ import annotations

import os

import torch.distributed as dist

from planc.runtime.compose import compose
from planc.runtime.loop import train
from planc.spec import Layout, Plan
from planc.strategies.registry import load_registry


def measure(cases: list[dict]) -> dict:
    registry = load_registry()
    os.environ["PLANC_VERIFY"] = "1"
    for case in cases:
        unmeasured = case.get("unmeasured", 0)
        os.environ["PLANC_VERIFY_UNMEASURED"] = str(unmeasured)
        job = compose(Plan.model_validate(case["plan"]), Layout(**case["layout"]), registry)
        train(job, steps=unmeasured + 4, out_dir=case["out_dir"], quiet=True)
        dist.barrier()
    return {"cases": len(cases)}


def count_callbacks(_payload=None) -> dict:
    """Bytes the traffic counter sees where collectives are issued in futures' callbacks: one that
    runs in gloo's thread (the future completes later) and one that runs inline (it had completed)."""
    import torch

    from planc.verify.comm_counter import CommCounter

    names, sizes = {str(dist.group.WORLD.group_name): "world"}, {"world": dist.get_world_size()}
    x, y, z = torch.ones(10), torch.ones(20), torch.ones(30)

    def reduce_y(future):
        dist.all_reduce(y)
        return future.value()

    def reduce_z_chained(future):
        return dist.all_reduce(z, async_op=True).get_future().then(lambda g: g.value()).wait()

    counted = {}
    with CommCounter(names, sizes) as later:
        dist.all_reduce(x, async_op=True).get_future().then(reduce_z_chained).wait()
    counted["in gloo's thread"] = dict(later.bytes)
    with CommCounter(names, sizes) as inline:
        done = dist.all_reduce(x, async_op=True).get_future()
        done.wait()
        done.then(reduce_y).wait()
    counted["inline"] = dict(inline.bytes)
    return {name: {str(key): value for key, value in found.items()} for name, found in counted.items()}
