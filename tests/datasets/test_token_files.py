"""Token files in planc's, nanoGPT's and Megatron-LM's layouts; the window order; batches from them."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from planc.data.order import WindowOrder
from planc.data.token_files import TokenFileError, open_token_file, sidecar_path
from planc.runtime.data import DataError, build_source
from planc.runtime.token_data import TokenFileData
from planc.spec import ModelSpec


def write_megatron(prefix, documents: list[list[int]], dtype=np.uint16, code=8) -> None:
    """An indexed dataset as Megatron-LM's _IndexWriter lays it out (megatron/core/datasets/
    indexed_dataset.py): b"MMIDIDX\\x00\\x00", version u64 = 1, dtype code u8 (8 = uint16, 4 = int32),
    sequence count u64, document count u64, int32 sequence lengths, int64 byte pointers, int64
    document indices; the .bin is the sequences' ids back to back."""
    lengths = np.array([len(d) for d in documents], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) * np.dtype(dtype).itemsize
    with open(f"{prefix}.idx", "wb") as index:
        index.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code))
        index.write(struct.pack("<Q", len(documents)) + struct.pack("<Q", len(documents) + 1))
        index.write(lengths.tobytes() + pointers.tobytes() + np.arange(len(documents) + 1, dtype=np.int64).tobytes())
    np.concatenate([np.asarray(d, dtype=dtype) for d in documents]).tofile(f"{prefix}.bin")


def test_nanogpt_bin_is_headerless_uint16(tmp_path):
    ids = np.array([5, 0, 65535, 7, 3], dtype=np.uint16)  # nanoGPT: np.memmap(..., dtype=np.uint16), no header
    ids.tofile(tmp_path / "train.bin")
    token_file = open_token_file(tmp_path / "train.bin")
    assert token_file.layout == "nanogpt" and token_file.tokens == 5
    assert token_file.array().tolist() == ids.tolist()
    assert token_file.max_id is None and token_file.scan_max_id() == 65535


def test_sidecar_names_the_dtype_and_is_checked_against_the_file(tmp_path):
    path = tmp_path / "t.bin"
    np.array([70000, 1, 2], dtype="<u4").tofile(path)
    sidecar_path(path).write_text(json.dumps({"dtype": "uint32", "vocab_size": 80000, "max_id": 70000}))
    token_file = open_token_file(path)
    assert (token_file.layout, token_file.tokens, token_file.vocab_size) == ("planc", 3, 80000)
    assert token_file.array().tolist() == [70000, 1, 2]
    sidecar_path(path).write_text(json.dumps({"dtype": "uint32", "tokens": 4}))
    with pytest.raises(TokenFileError, match="holds 3 tokens but its sidecar t.bin.json says 4"):
        open_token_file(path)
    sidecar_path(path).write_text(json.dumps({"dtype": "float32"}))
    with pytest.raises(TokenFileError, match="names dtype 'float32'"):
        open_token_file(path)


def test_odd_sized_headerless_file_suggests_a_sidecar(tmp_path):
    (tmp_path / "t.bin").write_bytes(b"\x01\x02\x03")  # 3 bytes: not whole uint16 ids
    with pytest.raises(TokenFileError, match='"dtype": "uint32"'):
        open_token_file(tmp_path / "t.bin")


@pytest.mark.parametrize("name", ["corpus_text_document", "corpus_text_document.bin", "corpus_text_document.idx"])
def test_megatron_indexed_dataset_is_one_stream_of_its_documents(tmp_path, name):
    documents = [[1, 2, 3, 0], [4, 5, 0], [6, 7, 8, 9, 0]]
    write_megatron(tmp_path / "corpus_text_document", documents)
    token_file = open_token_file(tmp_path / name)
    assert token_file.layout == "megatron" and token_file.dtype == np.uint16
    assert token_file.array().tolist() == [i for d in documents for i in d]


def test_megatron_int32_and_mismatched_pairs(tmp_path):
    write_megatron(tmp_path / "a", [[100_000, 1], [2]], dtype=np.int32, code=4)
    assert open_token_file(tmp_path / "a").array().tolist() == [100_000, 1, 2]
    write_megatron(tmp_path / "b", [[1, 2, 3]])
    np.zeros(5, dtype=np.uint16).tofile(tmp_path / "b.bin")  # another .bin under the same prefix
    with pytest.raises(TokenFileError, match="does not belong together"):
        open_token_file(tmp_path / "b")


@settings(max_examples=60, deadline=None)
@given(windows=st.integers(1, 5000), key=st.integers(0, 2**64 - 1), epoch=st.integers(0, 1000))
def test_window_order_is_a_permutation_of_every_epoch(windows, key, epoch):
    order = WindowOrder(windows, key)
    assert sorted(order.permute(np.arange(windows), epoch).tolist()) == list(range(windows))


def test_window_order_reshuffles_each_epoch_and_spans_epochs():
    order = WindowOrder(1000, key=3)
    first, second = order.permute(np.arange(1000), 0), order.permute(np.arange(1000), 1)
    assert (first != second).mean() > 0.9  # a fresh order, not a rotation of the last
    assert (first != np.arange(1000)).mean() > 0.9
    # Positions 995..1004 are the last 5 of epoch 0, then the first 5 of epoch 1.
    assert order.windows_at(np.arange(995, 1005)).tolist() == first[995:].tolist() + second[:5].tolist()


def test_windows_cover_an_epoch_exactly_once_and_steps_are_pure(tmp_path):
    ids = np.arange(8 * 12 + 1, dtype=np.uint16) % 500  # 97 ids: (97 - 1) // 8 = 12 windows
    ids.tofile(tmp_path / "t.bin")
    data = TokenFileData(tmp_path / "t.bin", vocab=512, seq_len=8, global_batch=4, seed=0)
    assert data.windows == 12
    rows = torch.cat([data.batch_for_step(step) for step in range(3)])  # 3 steps x 4 rows = one epoch
    starts = sorted(int(row[0]) for row in rows)  # window i starts at id i*8 (the ids are their offsets)
    assert starts == list(range(0, 96, 8))
    assert all(row.tolist() == list(range(int(row[0]), int(row[0]) + 9)) for row in rows)
    again = TokenFileData(tmp_path / "t.bin", vocab=512, seq_len=8, global_batch=4, seed=0)
    assert torch.equal(again.batch_for_step(7), data.batch_for_step(7))  # no iterator state: step 7 alone
    assert torch.equal(again.rows_for_step(7, 1, 3), data.batch_for_step(7)[1:3])  # a rank's rows alone
    other_seed = TokenFileData(tmp_path / "t.bin", vocab=512, seq_len=8, global_batch=4, seed=1)
    assert not torch.equal(other_seed.batch_for_step(0), data.batch_for_step(0))


def test_an_id_beyond_the_vocabulary_stops_the_run_with_the_step(tmp_path):
    ids = np.zeros(200, dtype=np.uint16)
    ids[150] = 600
    ids.tofile(tmp_path / "t.bin")  # no sidecar: nothing known until a batch holds the id
    data = TokenFileData(tmp_path / "t.bin", vocab=512, seq_len=8, global_batch=24, seed=0)
    with pytest.raises(DataError, match=r"token id 600 \(in the batch of step 1\), but model.vocab = 512"):
        data.batch_for_step(0)  # 24 rows = every window of the file


def test_build_source_picks_the_reader_and_resolves_against_the_root(tmp_path, prepared):
    model = ModelSpec(layers=1, hidden=16, heads=2, vocab=512, seq_len=16)
    source = build_source("train.bin", model, global_batch=2, seed=0, root=prepared)
    assert isinstance(source, TokenFileData) and source.batch_for_step(0).shape == (2, 17)
    with pytest.raises(DataError, match="train.val_data: no such token file"):
        build_source("val.bin", model, global_batch=2, seed=0, root=tmp_path, key="train.val_data")
    synthetic = build_source("synthetic", model, global_batch=2, seed=0)
    held_out = build_source("synthetic", model, global_batch=2, seed=0, key="train.val_data")
    assert torch.equal(synthetic.successors, held_out.successors)  # the same chain ...
    assert not torch.equal(synthetic.batch_for_step(0), held_out.batch_for_step(0))  # ... other walks
