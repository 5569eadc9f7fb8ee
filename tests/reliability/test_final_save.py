"""A full disk at the very end: the last checkpoint cannot be saved, so the run has not finished.

One process, 4 steps, a checkpoint every 2: the checkpoint of step 4 fails with ENOSPC (the test-only
PLANC_FAULT hook in DCP's writer, at the periodic save and again at the final one). `planc run` must
end non-zero and say that steps 3-4 are not saved; running again (the disk freed: no fault) retrains
them from step 2 and finishes, with the same losses as the single-process reference.
"""

from __future__ import annotations

import pytest

from planc.rundir.checkpoints import complete_steps

from .conftest import assert_matches_reference, losses, planc_run, reference, write_plan

pytestmark = pytest.mark.dist


def test_a_failed_final_save_fails_the_run_and_a_rerun_trains_the_lost_steps_again(tmp_path):
    plan = write_plan(
        tmp_path / "full.plan", per_node=1, layout="tp = 1  pp = 1  dp = 1", steps=4, checkpoint="every = 2"
    )
    out = tmp_path / "run"
    failed = planc_run(plan, out, PLANC_FAULT="save-error@rank=0,step=4,attempt=any", timeout=120)
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "trained to step 4, but the checkpoint of step 4 could not be saved" in failed.stderr
    assert "the weights of steps 3-4 are not saved anywhere" in failed.stderr
    assert "planc: done" not in failed.stderr
    assert complete_steps(out / "checkpoints") == [2]

    again = planc_run(plan, out, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from step 2" in again.stdout + again.stderr
    assert complete_steps(out / "checkpoints") == [2, 4]
    assert_matches_reference(losses(out), reference(plan, 4))
