"""The loop's next rows: built ahead while the step runs, handed to the step they belong to, and a
failure while building them raised in that step, not in the one that prepared them."""

from types import SimpleNamespace

import pytest
import torch

from planc.runtime.loop import NextRows


class CountingSource:
    """A data source of 4 rows per step whose rows say their step; it runs out at ``ends_at``."""

    global_batch = 4

    def __init__(self, ends_at: int = 100):
        self.calls: list[int] = []
        self.ends_at = ends_at

    def rows_for_step(self, step: int, start: int, stop: int) -> torch.Tensor:
        self.calls.append(step)
        if step >= self.ends_at:
            raise ValueError(f"the token file has no batch for step {step}")
        return torch.full((stop - start, 3), step)


def _job(dp_rank: int = 1, dp: int = 2):
    return SimpleNamespace(coordinates={"dp": dp_rank}, layout=SimpleNamespace(dp=dp, micro_batch=1))


def test_a_prepared_step_is_built_once_and_only_for_its_own_step():
    source = CountingSource()
    rows = NextRows(_job(), source)
    assert rows.take(0).tolist() == [[0, 0, 0], [0, 0, 0]]  # rank 1 of 2: rows 2..3 of 4
    rows.prepare(1)
    assert rows.take(1)[0, 0].item() == 1
    assert source.calls == [0, 1]  # step 1 was built once, while "step 0 ran"
    rows.prepare(5)  # a step that will not come next (say, the loop resumed elsewhere)
    assert rows.take(2)[0, 0].item() == 2 and source.calls == [0, 1, 5, 2]


def test_a_failure_while_preparing_is_raised_by_the_step_that_needs_the_rows():
    source = CountingSource(ends_at=3)
    rows = NextRows(_job(), source)
    rows.prepare(3)  # runs inside step 2: must not fail step 2
    with pytest.raises(ValueError, match="no batch for step 3"):
        rows.take(3)
