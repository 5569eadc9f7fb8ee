"""A run continues at another layout or device count, and its losses continue the uninterrupted run's.

Three changes, each checkpoint written at one layout and resharded by DCP onto another:

  ZeRO-3 x 4   -> TP 2 x DP 2      (fully sharded dim-0 shards -> column/row tensor-parallel shards)
  PP 2 x DP 2  -> 1 process        (pipeline stages and their optimizer state -> one whole model),
                                   through `planc run NEW.plan --resume-from RUN`
  DDP x 2      -> FSDP x 4         (replicated -> sharded over twice the processes)

Steps 1-2 run at the first layout, steps 3-4 at the second; all four must equal the single-process
reference within the fp32 equivalence bound (1e-5). Two torchrun launches (2, then 4 processes) and
one `planc run` keep it quick. `planc run` refuses to continue under another model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planc.cli import main
from planc.dsl.load import load_plan
from planc.strategies.registry import load_registry

from .conftest import assert_matches_reference, env, losses, planc_run, reference, write_plan

pytestmark = pytest.mark.dist

RUNNER = Path(__file__).with_name("layout_runner.py")
LAYOUTS = {
    "ddp2": dict(dp=2),
    "zero3x4": dict(dp=4, zero=3),
    "pp2dp2": dict(pp=2, dp=2, schedule="1f1b"),
    "tp2dp2": dict(tp=2, dp=2),
    "fsdp4": dict(dp=4, zero=3),
}


def launch(world: int, cases: list[dict], folder: Path) -> None:
    path = folder / f"cases-{world}.json"
    path.write_text(json.dumps(cases))
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
        + [str(RUNNER), str(path)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]


def case(name: str, plans: dict, out: Path, steps: int, resume_from: Path | None = None) -> dict:
    layout = dict(tp=1, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=2) | LAYOUTS[name]
    world = layout["tp"] * layout["pp"] * layout["dp"]
    return {
        "name": name,
        "plan": plans[world],
        "layout": layout,
        "steps": steps,
        "out_dir": str(out / name),
        "resume_from": str(resume_from) if resume_from else None,
    }


def test_three_layout_changes_continue_the_reference(tmp_path, capsys):
    plans = {}
    for world in (1, 2, 4):
        path = write_plan(
            tmp_path / f"w{world}.plan",
            per_node=world,
            layout="tp = 1  pp = 1  dp = 1  zero = 0" if world == 1 else "tp = auto",
            steps=4,
            checkpoint="every = 2  keep = 1",
        )
        plans[world] = load_plan(path, strategies=load_registry()).model_dump(mode="json")
    out = tmp_path / "runs"
    step2 = "checkpoints/step-00000002"
    launch(2, [case("ddp2", plans, out, 2)], tmp_path)
    launch(
        4,
        [
            case("zero3x4", plans, out, 2),
            case("pp2dp2", plans, out, 2),
            case("tp2dp2", plans, out, 4, resume_from=out / "zero3x4" / step2),
            case("fsdp4", plans, out, 4, resume_from=out / "ddp2" / step2),
        ],
        tmp_path,
    )
    one = planc_run(tmp_path / "w1.plan", out / "one", "--resume-from", str(out / "pp2dp2"))
    assert one.returncode == 0, one.stderr[-4000:]
    assert "continuing from step 2 of" in one.stderr and "resumed from step 2 (checkpoint" in one.stdout

    expected = reference(tmp_path / "w1.plan", 4)
    for first, then in (("zero3x4", "tp2dp2"), ("pp2dp2", "one"), ("ddp2", "fsdp4")):
        assert sorted(losses(out / first)) == [1, 2] and sorted(losses(out / then)) == [3, 4], (first, then)
        assert_matches_reference(losses(out / first) | losses(out / then), expected)

    # Another model cannot continue from these checkpoints: refused before anything is written.
    other = write_plan(tmp_path / "wide.plan", per_node=1, layout="dp = 1", steps=4).read_text()
    (tmp_path / "wide.plan").write_text(other.replace("hidden = 32", "hidden = 64"))
    wide = ["run", str(tmp_path / "wide.plan"), "--out", str(out / "wide"), "--resume-from", str(out / "ddp2")]
    assert main(wide) == 1
    assert "model.hidden is 32 in the checkpoint, 64 here" in capsys.readouterr().err
    assert not (out / "wide").exists()
