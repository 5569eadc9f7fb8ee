"""Checkpoint integrity without processes: the manifest catches damage, a failed write loses nothing.

Single-process saves (no process group): the same code path every rank runs, minus the collectives.
"""

from __future__ import annotations

import pytest

from planc.rundir.checkpoints import integrity_problems, list_checkpoints, step_dir
from planc.rundir.manifest import read_manifest
from planc.runtime.checkpoint_write import CheckpointSaveError, save_checkpoint
from planc.runtime.faults import parse_faults
from planc.runtime.optim import build_lr_scheduler, build_optimizer
from planc.runtime.transformer import build_model, init_weights
from planc.spec import build_plan

PLAN = build_plan(
    {
        "model": {"layers": 1, "hidden": 32, "heads": 4, "vocab": 64, "seq_len": 16, "vocab_multiple": 1},
        "hardware": {"device": "cpu"},
        "train": {"global_batch": 4, "precision": "fp32"},
    }
)


@pytest.fixture
def state():
    model = build_model(PLAN.model)
    init_weights(model, 0)
    optimizer = build_optimizer(model.parameters(), PLAN.train)
    return [model], [optimizer], [build_lr_scheduler(optimizer, PLAN.train)]


def test_manifest_lists_every_file_and_catches_truncation_loss_and_changed_bytes(tmp_path, state):
    path = save_checkpoint(tmp_path, 2, *state)
    manifest = read_manifest(path)
    assert sorted(manifest["files"]) == [".metadata", "__0_0.distcp", "planc.json"]
    assert integrity_problems(path) == []

    shard = path / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one changed byte, same size
    shard.write_bytes(bytes(data))
    assert integrity_problems(path, hash_names=()) == []  # sizes alone cannot see it ...
    assert integrity_problems(path) == ["__0_0.distcp does not match its SHA-256 in the manifest (corrupted)"]

    shard.write_bytes(bytes(data[:-10]))
    assert integrity_problems(path, hash_names=()) == [
        f"__0_0.distcp has {len(data) - 10} bytes, the manifest says {len(data)} (truncated or rewritten)"
    ]
    shard.unlink()
    assert integrity_problems(path) == ["__0_0.distcp is missing"]


def test_the_manifest_hashes_the_weights_apart_from_the_optimizer_state(tmp_path, state):
    """A DCP file's model_sha256 covers its model items alone: the SHA-256 of their SHA-256s, in
    offset order, each computed here straight from the file's bytes."""
    import hashlib

    from planc.runtime.checkpoint import SafeFileSystemReader

    path = save_checkpoint(tmp_path, 2, *state)
    files = read_manifest(path)["files"]
    assert [name for name, entry in files.items() if "model_sha256" in entry] == ["__0_0.distcp"]
    storage = SafeFileSystemReader(path).read_metadata().storage_data
    spans = sorted({(i.offset, i.length) for k, i in storage.items() if k.fqn.startswith("model.")})
    assert len(spans) == len(state[0][0].state_dict())  # one item per weight
    data = (path / "__0_0.distcp").read_bytes()
    digests = b"".join(hashlib.sha256(data[o : o + n]).digest() for o, n in spans)
    assert files["__0_0.distcp"]["model_sha256"] == hashlib.sha256(digests).hexdigest()


def test_item_hashes_are_right_across_read_chunks(tmp_path, monkeypatch):
    """The save hashes the file and its items in one pass of 1 MiB reads; items straddle the reads."""
    import hashlib

    from planc.rundir import manifest

    monkeypatch.setattr(manifest, "_CHUNK", 7)  # every item below crosses at least one read
    data = bytes(range(256)) * 3
    (tmp_path / "f").write_bytes(data)
    spans = [(100, 50), (3, 20), (700, 68), (3, 20)]  # unsorted, one repeated: hashed once, in order
    whole, items = manifest._hash_file(tmp_path / "f", spans)
    assert whole == hashlib.sha256(data).hexdigest()
    assert items == [hashlib.sha256(data[o : o + n]).digest() for o, n in [(3, 20), (100, 50), (700, 68)]]


def test_a_full_disk_during_a_save_keeps_the_previous_checkpoint(tmp_path, state, monkeypatch):
    save_checkpoint(tmp_path, 2, *state)
    monkeypatch.setenv("PLANC_FAULT", "save-error@rank=0,step=4,bytes=5000")
    with pytest.raises(CheckpointSaveError) as failed:
        save_checkpoint(tmp_path, 4, *state)
    message = str(failed.value)
    assert message.startswith("could not save the checkpoint of step 4 (rank 0: [Errno 28] No space left on device")
    assert message.endswith("its partial files were removed; the previous checkpoint step-00000002 is intact")
    assert (failed.value.step, failed.value.previous) == (4, 2)
    assert [(e.path.name, e.state) for e in list_checkpoints(tmp_path)] == [("step-00000002", "complete")]
    assert integrity_problems(step_dir(tmp_path, 2)) == []


def test_fault_specs_are_parsed_strictly():
    (kill, hang) = parse_faults("kill@rank=1,step=3;hang@rank=0,step=5,attempt=any")
    assert (kill.kind, kill.rank, kill.step, kill.attempt) == ("kill", 1, 3, 0)
    assert hang.attempt is None
    with pytest.raises(ValueError, match="unknown fault 'explode'"):
        parse_faults("explode@rank=0,step=1")
    with pytest.raises(ValueError, match="needs rank=R and step=S"):
        parse_faults("kill@rank=0")
