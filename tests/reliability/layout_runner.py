"""Train layout cases under torchrun; a case may start from another case's checkpoint.

    torchrun --standalone --nproc-per-node N layout_runner.py CASES.json

``CASES.json`` is a list of ``{"name", "plan" (Plan JSON), "layout" (Layout fields), "steps",
"out_dir", "resume_from"}``; every case has ``tp x pp x dp = N``. Each case builds a fresh job
(:func:`planc.runtime.compose.compose`) and trains to ``steps`` into ``out_dir`` (metrics.jsonl,
checkpoints/). With ``resume_from`` (a checkpoint directory), rank 0 first writes
``out_dir/resume.json`` the way `planc run --resume-from` does, so the job starts from that
checkpoint at its own layout (DCP reshards). Rank 0 also writes ``plan.json`` as `planc run` would,
so that a later `planc run --resume-from out_dir` can check the model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist

from planc.rundir.carry_over import write_resume_source
from planc.runtime.compose import compose
from planc.runtime.loop import shutdown, train
from planc.spec import Layout, Plan
from planc.strategies.registry import load_registry


def run_case(case: dict) -> None:
    plan = Plan.model_validate(case["plan"])
    out = Path(case["out_dir"])
    job = compose(plan, Layout(**case["layout"]), load_registry())
    if job.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps({"plan": case["plan"], "layout": case["layout"]}))
        if case.get("resume_from"):
            source = Path(case["resume_from"])
            step = json.loads((source / "planc.json").read_text())["step"]
            write_resume_source(out, checkpoint=source, step=step, from_run=source.parent.parent)
    dist.barrier()
    train(job, steps=case["steps"], out_dir=out, quiet=True)


def main(cases_path: str) -> int:
    for case in json.loads(Path(cases_path).read_text()):
        run_case(case)
        dist.barrier()
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
