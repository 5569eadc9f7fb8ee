"""Checkpoints: a resumed run continues exactly; incomplete ones are ignored; only `keep` survive."""

import json

import pytest
import torch

from planc.runtime.checkpoint import (
    CheckpointError,
    complete_steps,
    latest_step,
    load_checkpoint,
    step_dir,
)
from planc.runtime.checkpoint_write import save_checkpoint
from planc.runtime.optim import build_lr_scheduler, build_optimizer
from planc.runtime.reference import train_reference
from planc.runtime.transformer import build_model, init_weights
from planc.spec import build_plan

TINY = dict(
    layers=2,
    hidden=32,
    heads=4,
    kv_heads=2,
    vocab=64,
    seq_len=16,
    vocab_multiple=1,
    mlp="swiglu",
    norm="rmsnorm",
    position="rope",
)


def plan(every=4, keep=3, steps=8):
    return build_plan(
        {
            "model": TINY,
            "hardware": {"device": "cpu"},
            "train": dict(global_batch=8, micro_batch=4, lr=3e-3, warmup_steps=3, steps=steps, precision="fp32"),
            "checkpoint": dict(every=every, keep=keep),
        }
    )


@pytest.mark.dist(launches=False)  # three in-process training runs, two DCP round trips: the slow half
def test_resume_gives_the_losses_of_an_uninterrupted_run(tmp_path):
    uninterrupted = train_reference(plan())
    first = train_reference(plan(), steps=5, checkpoint_dir=tmp_path)  # saves at step 4, "crashes" after 5
    assert complete_steps(tmp_path) == [4]
    resumed = train_reference(plan(), checkpoint_dir=tmp_path)
    assert resumed.first_step == 4
    assert first.losses == uninterrupted.losses[:5]
    # Model, Adam moments, step counts and the LR schedule all came back: bit-identical continuation.
    assert resumed.losses == uninterrupted.losses[4:]
    assert resumed.lrs == uninterrupted.lrs[4:]
    assert complete_steps(tmp_path) == [4, 8]


def _parts(seed=0):
    p = plan()
    model = build_model(p.model)
    init_weights(model, seed)
    optimizer = build_optimizer(model.parameters(), p.train)
    return model, optimizer, build_lr_scheduler(optimizer, p.train)


def test_incomplete_checkpoint_is_ignored(tmp_path):
    model, optimizer, scheduler = _parts()
    save_checkpoint(tmp_path, 3, [model], [optimizer], [scheduler])
    crashed = tmp_path / "step-00000009.tmp"  # a save that died half way: no metadata, junk files
    crashed.mkdir()
    (crashed / "__0_0.distcp").write_bytes(b"garbage")
    no_metadata = step_dir(tmp_path, 7)  # renamed but unreadable: not complete either
    no_metadata.mkdir()
    assert latest_step(tmp_path) == 3
    fresh, fresh_opt, fresh_sched = _parts(seed=1)
    metadata = load_checkpoint(tmp_path, [fresh], [fresh_opt], [fresh_sched])
    assert metadata["step"] == 3
    for (name, a), b in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(a, b), name


def test_keep_deletes_older_checkpoints_and_abandoned_tmp(tmp_path):
    model, optimizer, scheduler = _parts()
    (tmp_path / "step-00000001.tmp").mkdir(parents=True)
    for step in (2, 4, 6, 8):
        save_checkpoint(tmp_path, step, [model], [optimizer], [scheduler], keep=2, extra={"note": step})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000006", "step-00000008"]
    metadata = json.loads((step_dir(tmp_path, 8) / "planc.json").read_text())
    assert metadata["step"] == 8 and metadata["extra"] == {"note": 8}


def test_no_checkpoint_loads_nothing_and_mismatches_are_explained(tmp_path):
    model, optimizer, scheduler = _parts()
    assert load_checkpoint(tmp_path / "none", [model], [optimizer], [scheduler]) is None
    with pytest.raises(CheckpointError, match="one optimizer per model part"):
        save_checkpoint(tmp_path, 1, [model, model], [optimizer], [scheduler])
    save_checkpoint(tmp_path, 1, [model], [optimizer], [scheduler])
    with pytest.raises(CheckpointError, match="scheduler"):
        load_checkpoint(tmp_path, [model], [optimizer], [])


class _Exploit:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        import os

        return (os.mkdir, (self.target,))


def test_a_tampered_metadata_file_is_refused_not_executed(tmp_path):
    import pickle

    model, optimizer, scheduler = _parts()
    path = save_checkpoint(tmp_path, 1, [model], [optimizer], [scheduler])
    marker = tmp_path / "pwned"
    (path / ".metadata").write_bytes(pickle.dumps(_Exploit(str(marker))))
    with pytest.raises(CheckpointError, match="refusing to read .metadata"):
        load_checkpoint(tmp_path, [model], [optimizer], [scheduler])
    assert not marker.exists()


def test_optimizer_hyperparameters_come_back_with_their_types(tmp_path):
    model, optimizer, scheduler = _parts()
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    save_checkpoint(tmp_path, 3, [model], [optimizer], [scheduler])
    fresh, fresh_opt, fresh_sched = _parts(seed=1)
    load_checkpoint(tmp_path, [fresh], [fresh_opt], [fresh_sched])
    for saved, loaded in zip(optimizer.param_groups, fresh_opt.param_groups):
        assert {k: v for k, v in saved.items() if k != "params"} == {k: v for k, v in loaded.items() if k != "params"}
    assert isinstance(fresh_opt.param_groups[0]["betas"], tuple)
    assert fresh_sched.get_last_lr() == scheduler.get_last_lr() and fresh_sched.last_epoch == 3


def test_optimizer_states_come_back_when_the_gradients_are_zeroed_views_not_none(tmp_path):
    # planc's DDP keeps every gradient as a zeroed view into its buckets, never None. DCP creates a
    # fresh optimizer's states (to load into) only when no gradient exists: it used to skip them, and
    # a resumed DDP run restarted Adam's moments from zero (tests/reliability caught the losses).
    model, optimizer, scheduler = _parts()
    for param in model.parameters():
        param.grad = torch.randn_like(param)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    save_checkpoint(tmp_path, 3, [model], [optimizer], [scheduler])
    fresh, fresh_opt, fresh_sched = _parts(seed=1)
    grads = [torch.zeros_like(p) for p in fresh.parameters()]
    for param, grad in zip(fresh.parameters(), grads):
        param.grad = grad  # as DDP's bucket views: present from the start
    load_checkpoint(tmp_path, [fresh], [fresh_opt], [fresh_sched])
    saved, loaded = optimizer.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert loaded.keys() == saved.keys() and len(saved) == len(list(model.parameters()))
    for index, state in saved.items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(loaded[index][name], state[name]), (index, name)
    # the same gradient tensors (the bucket views) are back on the parameters, still zero
    assert all(p.grad is g and not g.any() for p, g in zip(fresh.parameters(), grads))
