"""Data: deterministic global batches per step, exact dp/micro-batch coverage, byte-level text files."""

import numpy as np
import pytest
import torch

from planc.runtime.data import (
    BRANCHING,
    DataError,
    SyntheticData,
    TextFileData,
    build_data,
    inputs_and_targets,
    local_batch,
    split_micro_batches,
)
from planc.runtime.rows import rank_rows
from planc.spec import ModelSpec, TrainSpec


def test_synthetic_is_a_pure_function_of_seed_and_step():
    a, b = SyntheticData(100, 12, 8, seed=3), SyntheticData(100, 12, 8, seed=3)
    assert torch.equal(a.batch_for_step(5), b.batch_for_step(5))
    assert torch.equal(a.batch_for_step(5), a.batch_for_step(5))  # no hidden iterator state
    assert not torch.equal(a.batch_for_step(5), a.batch_for_step(6))
    assert not torch.equal(a.batch_for_step(5), SyntheticData(100, 12, 8, seed=4).batch_for_step(5))


def test_synthetic_follows_its_markov_chain():
    data = SyntheticData(50, 20, 16, seed=0)
    batch = data.batch_for_step(0)
    assert batch.shape == (16, 21) and batch.dtype == torch.long
    assert int(batch.min()) >= 0 and int(batch.max()) < 50
    for prev, nxt in zip(batch[:, :-1].flatten().tolist(), batch[:, 1:].flatten().tolist()):
        assert nxt in data.successors[prev].tolist()
    assert data.successors.shape == (50, BRANCHING)


def test_synthetic_walk_is_the_plain_walk_of_each_rows_random_stream():
    """The vectorised walk reads each row's random numbers as a plain token-by-token walk does:
    the first token, then one successor choice per position, from the stream of (seed, step, row)."""
    from planc.runtime.data import _stream_seed

    data = SyntheticData(97, 33, 5, seed=11)
    expected = torch.empty(5, 34, dtype=torch.long)
    for row in range(5):
        rng = np.random.default_rng(_stream_seed(11, "synthetic", 7, row))
        expected[row, 0] = int(rng.integers(0, 97))
        choices = rng.integers(0, BRANCHING, 33)
        for position in range(1, 34):
            expected[row, position] = data.successors[expected[row, position - 1], choices[position - 1]]
    got = data.batch_for_step(7)
    assert torch.equal(got, expected) and got.is_contiguous()


@pytest.mark.parametrize("kind", ["synthetic", "text"])
def test_a_ranks_rows_are_the_global_batchs_rows_built_alone(tmp_path, kind):
    """A rank builds only its rows; they are exactly those rows of the global batch."""
    if kind == "synthetic":
        data = SyntheticData(256, 8, 12, seed=2)
    else:
        (tmp_path / "c.txt").write_bytes(bytes(range(256)) * 2)
        data = TextFileData(tmp_path / "c.txt", 256, 8, 12, seed=2)
    for step in (0, 3, 9):  # the text file's 63 windows: step 9 is in a later epoch
        batch = data.batch_for_step(step)
        assert torch.equal(data.rows_for_step(step, 4, 7), batch[4:7])
        assert torch.equal(torch.cat([local_batch(data, step, rank, 3, 2) for rank in range(3)]), batch)
    with pytest.raises(ValueError, match="not rows of a global batch of 12"):
        data.rows_for_step(0, 10, 13)


def test_inputs_and_targets_are_shifted_by_one():
    batch = torch.arange(10).view(2, 5)
    inputs, targets = inputs_and_targets(batch)
    assert inputs.tolist() == [[0, 1, 2, 3], [5, 6, 7, 8]]
    assert targets.tolist() == [[1, 2, 3, 4], [6, 7, 8, 9]]


@pytest.mark.parametrize("dp,micro", [(1, 12), (1, 3), (2, 2), (3, 4), (4, 1), (6, 2)])
def test_dp_ranks_and_micro_batches_cover_the_batch_exactly_once(dp, micro):
    batch = torch.arange(12 * 3).view(12, 3)
    pieces = []
    for rank in range(dp):
        start, stop = rank_rows(12, rank, dp, micro)
        pieces += split_micro_batches(batch[start:stop], micro)
    assert all(p.shape[0] == micro for p in pieces)
    assert len(pieces) == 12 // micro
    # In rank order then micro-batch order, the pieces are the global batch row for row.
    assert torch.equal(torch.cat(pieces), batch)


def test_rank_r_gets_its_contiguous_block():
    # dp = 4: rank 2 gets rows [2*8/4, 3*8/4) = [4, 6)
    assert rank_rows(8, 2, 4, 1) == (4, 6)


def test_slicing_errors_say_what_does_not_divide():
    with pytest.raises(ValueError, match="not divisible by dp = 5"):
        rank_rows(12, 0, 5, 1)
    with pytest.raises(ValueError, match="micro_batch = 4"):
        rank_rows(12, 0, 2, 4)
    with pytest.raises(ValueError, match="micro_batch = 4"):
        split_micro_batches(torch.zeros(6, 3), 4)


def test_text_file_windows_cover_an_epoch_exactly_once(tmp_path):
    text = bytes((i * 7) % 256 for i in range(8 * 12 + 1))  # 97 bytes: (97 - 1) // 8 = 12 windows
    path = tmp_path / "corpus.txt"
    path.write_bytes(text)
    data = TextFileData(path, vocab=256, seq_len=8, global_batch=4, seed=0)
    assert data.windows == 12
    rows = torch.cat([data.batch_for_step(step) for step in range(3)])  # 3 steps x 4 rows = one epoch
    starts = []
    for row in rows.tolist():
        # every row is a contiguous 9-byte slice starting at a multiple of seq_len
        start = next(s for s in range(0, 97, 8) if list(text[s : s + 9]) == row)
        starts.append(start)
    assert sorted(starts) == list(range(0, 96, 8))
    assert torch.equal(data.batch_for_step(1), TextFileData(path, 256, 8, 4, seed=0).batch_for_step(1))


def test_text_file_needs_a_byte_vocabulary(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("hello world " * 10)
    for vocab in (100, 300, 128_256):  # bytes are ids 0..255: fewer ids cannot hold them, more are never trained
        with pytest.raises(DataError, match="needs model.vocab = 256, but vocab = "):
            TextFileData(path, vocab=vocab, seq_len=8, global_batch=2, seed=0)


def test_text_file_errors_for_missing_or_short_files(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        TextFileData(tmp_path / "missing.txt", vocab=256, seq_len=8, global_batch=2, seed=0)
    short = tmp_path / "short.txt"
    short.write_text("12345678")  # 8 bytes < seq_len + 1 = 9
    with pytest.raises(DataError, match="fewer than one sequence"):
        TextFileData(short, vocab=256, seq_len=8, global_batch=2, seed=0)


def test_build_data_chooses_the_source(tmp_path):
    model = ModelSpec(layers=1, hidden=16, heads=2, vocab=256, seq_len=8)
    assert isinstance(build_data(TrainSpec(global_batch=2), model), SyntheticData)
    (tmp_path / "c.txt").write_text("abc" * 20)
    data = build_data(TrainSpec(global_batch=2, data="c.txt"), model, base_dir=tmp_path)
    assert isinstance(data, TextFileData) and data.batch_for_step(0).shape == (2, 9)
