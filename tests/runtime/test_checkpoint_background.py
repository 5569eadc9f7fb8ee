"""Background checkpoints stage into one host copy per run, and resume bit-identically (2 gloo processes).

An FSDP2 job (dp = 2) trains 3 steps with ``checkpoint { every = 1  async_save = true }``: each
step is saved in the background (the last one published by ``finish``). ``dcp.async_save`` must
get the same stager every time, and each later save must refill the first one's host buffers (the
same storage addresses) instead of allocating a fresh copy of all the state. A fresh job then
resumes from step 3 and must hold exactly the trained model and Adam state.
"""

import pytest
import torch
from ranks import run_ranks

from planc.spec import build_plan

PLAN = dict(
    model=dict(layers=2, hidden=32, heads=4, kv_heads=2, vocab=64, seq_len=16, vocab_multiple=1),
    hardware={"device": "cpu"},
    train=dict(global_batch=8, micro_batch=2, lr=3e-3, warmup_steps=1, steps=3, precision="fp32"),
    checkpoint=dict(every=1, keep=3, async_save=True),
)


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _state(job) -> dict[str, torch.Tensor]:
    """Every parameter and optimizer tensor of this rank, by name (local shards)."""
    values = {f"param.{name}": _local(p).detach().clone() for name, p in job.model_parts[0].named_parameters()}
    for optimizer in job.optimizers:
        for index, state in enumerate(optimizer.state.values()):
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    values[f"optim.{index}.{key}"] = _local(value).clone()
    return values


def check_one_stager(payload: dict) -> dict:
    """On each of the 2 ranks (tests/ranks.py)."""
    import torch.distributed.checkpoint as dcp

    from planc.runtime.attempt import Attempt
    from planc.runtime.compose import compose
    from planc.runtime.loop import train
    from planc.spec import Layout, Plan
    from planc.strategies.registry import load_registry

    plan = Plan.from_json(payload["plan"])
    layout = Layout(tp=1, pp=1, dp=2, zero=3, recompute="none", schedule=None, micro_batch=2)
    stagers, addresses = [], []
    original = dcp.async_save

    def spy(state, **kwargs):
        stager = kwargs.get("async_stager")
        stagers.append(id(stager) if stager is not None else None)
        if stager is not None:  # where the host copy of each tensor landed
            staged = stager.stage(state)
            addresses.append(sorted(_local(t).data_ptr() for part in staged.values() for t in part.values()))
        return original(state, **kwargs)

    dcp.async_save = spy
    try:
        job = compose(plan, layout, load_registry())
        train(job, out_dir=payload["out"], quiet=True)
    finally:
        dcp.async_save = original
    trained = _state(job)

    resumed = compose(plan, layout, load_registry())
    assert Attempt(resumed, out_dir=payload["out"], total_steps=3).start() == 3
    loaded = _state(resumed)
    assert loaded.keys() == trained.keys() and len(loaded) > 2
    different = [name for name in trained if not torch.equal(trained[name], loaded[name])]
    assert not different, different
    return {"stagers": stagers, "same_buffers": len(addresses) == 3 and addresses[0] == addresses[1] == addresses[2]}


@pytest.mark.dist
def test_background_saves_reuse_one_host_copy_and_resume_exactly(tmp_path):
    plan = build_plan(PLAN)
    result = run_ranks(
        "tests/runtime/test_checkpoint_background.py:check_one_stager",
        2,
        {"plan": plan.to_json(), "out": str(tmp_path / "run")},
    )
    first, second, third = result["stagers"]  # one background save per step
    assert first is not None and first == second == third
    assert result["same_buffers"]


def test_host_copy_is_pinned_only_on_cuda(monkeypatch):
    """Pinned buffers and non-blocking copies need CUDA (DCP refuses non-blocking copies without an
    accelerator); on CPU the host copy is plain memory. Never shared memory: the writer is a thread."""
    from planc.runtime import checkpoint_write

    monkeypatch.setattr(checkpoint_write, "DefaultStager", lambda options: options)
    cuda = checkpoint_write.background_stager(torch.device("cuda", 3))
    cpu = checkpoint_write.background_stager(torch.device("cpu"))
    assert (cuda.use_pinned_memory, cuda.use_non_blocking_copy) == (True, True)
    assert (cpu.use_pinned_memory, cpu.use_non_blocking_copy) == (False, False)
    assert not cuda.use_shared_memory and not cuda.use_async_staging and not cpu.use_async_staging
