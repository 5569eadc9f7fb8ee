"""Every process group a job's collectives run on gets the plan's collective timeout (and the margin
that lets planc's hang monitor report first).

A group left out keeps its backend's default (NCCL 10 minutes, gloo 30): a plan with ``timeout =
30 min`` for a slow checkpoint file system would still die at 10 minutes there, and one with
``timeout = 2 min`` would wait 10 before a hang is reported. One 2-rank gloo launch builds an HSDP
job (FSDP2 over a ("dp_replicate", "dp_shard") mesh, whose groups are new ones) with background
checkpoints (``dcp.async_save`` over a gloo group of its own), saves once, and reads the timeout of
every group that exists in the process: the default group, the mesh's, HSDP's and the save's.
"""

from __future__ import annotations

import pytest
from ranks import run_ranks

pytestmark = pytest.mark.dist  # starts two processes

TIMEOUT_S = 7  # the plan's, in whole seconds so that every group's timedelta compares exactly


def _plan_and_layout():
    from planc.spec import Layout, build_plan
    from planc.units import Quantity

    plan = build_plan(
        {
            "model": {"layers": 2, "hidden": 32, "heads": 4, "vocab": 64, "seq_len": 16},
            "hardware": {"device": "cpu", "per_node": 2},
            "train": {
                "global_batch": 4,
                "micro_batch": 2,
                "precision": "fp32",
                "timeout": Quantity(TIMEOUT_S, "time", "7 s"),
            },
            "checkpoint": {"every": 1, "async_save": True},
        }
    )
    # shard_group = 1 of dp = 2: two replicas of one-rank shard groups, the smallest HSDP mesh
    layout = Layout(tp=1, pp=1, dp=2, zero=3, shard_group=1, recompute="none", schedule=None, micro_batch=2)
    return plan, layout


def group_timeouts(payload) -> dict:
    import torch
    import torch.distributed as dist

    from planc.runtime.attempt import Attempt
    from planc.runtime.compose import compose
    from planc.strategies.registry import load_registry

    plan, layout = _plan_and_layout()
    job = compose(plan, layout, load_registry())
    attempt = Attempt(job, out_dir=payload["out"], total_steps=1)
    assert attempt.save(1)  # the first background save makes the save's gloo group
    attempt._finish_background_save()
    groups = list(dist.distributed_c10d._world.pg_map)
    cpu = torch.device("cpu")
    return {
        "groups": len(groups),
        "names": [(g.group_desc, dist.get_process_group_ranks(g)) for g in groups],
        "timeouts": sorted(g._get_backend(cpu).options._timeout.total_seconds() for g in groups),
    }


def test_every_group_of_an_hsdp_job_with_background_saves_gets_the_plan_timeout(tmp_path):
    got = run_ranks("tests/runtime/test_group_timeouts.py:group_timeouts", world=2, payload={"out": str(tmp_path)})
    # torch reuses the default group for a mesh dimension over every rank (dp, and HSDP's dp_replicate
    # here): default [0, 1] + pp [r] + tp [r] + dp_shard [r] (HSDP's, new) + the save's gloo group [0, 1]
    assert got["groups"] == 5, got
    assert "mesh_dp_shard" in [desc for desc, _ in got["names"]], got
    # each waits a little longer than the plan's 7 s, so that planc's hang monitor reports first:
    # 7 s + the report's grace min(7 s, 10 s) + 5 s = 19 s (planc.runtime.hangs.backend_timeout)
    assert got["timeouts"] == [19.0] * got["groups"], got
