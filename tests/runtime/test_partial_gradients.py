"""Gradients that backward leaves as pending sums (sequence parallelism's norms) are summed once."""

from __future__ import annotations

import pytest
from ranks import run_ranks


@pytest.mark.dist
def test_partial_gradients_are_summed_in_one_all_reduce_and_become_replicated():
    out = run_ranks("tests/runtime/ranks_partial_gradients.py:sum_partial_gradients", 2)
    assert out["before"] == ["P(sum)", "P(sum)"]  # what sequence parallelism leaves
    assert out["after"] == ["R", "R"] and out["reduced"] == 2
    assert out["all_reduces"] == 1  # both gradients in one buffer (DTensor would issue one per op)
    # by hand: d/d gain of sum over rows r of (r + 1) * gain = sum of (r + 1) over the 4 rows = 10,
    # each element; d/d bias of sum of (r + 1)^2 * bias = 1 + 4 + 9 + 16 = 30
    rows = range(1, 2 * out["world"] + 1)
    assert out["gain_grad"] == [float(sum(rows))] * 3
    assert out["bias_grad"] == [float(sum(r * r for r in rows))] * 2


@pytest.mark.dist
def test_ddps_local_shards_keep_partial_sums_until_one_all_reduce():
    out = run_ranks("tests/runtime/ranks_partial_gradients.py:sum_partial_shards", 2)
    assert out["partial"] == 2  # the norm's gain and bias
    assert out["local_is_partial"]  # backward did not sum them (it used to, one all-reduce each)
    assert out["all_reduces"] == 1
    assert out["summed"]  # equal to the whole sequence's gradients on one process
