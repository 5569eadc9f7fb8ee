"""On CUDA the Job binds its process to its GPU before it joins the process group.

NCCL ties a communicator (and any barrier before the first collective) to the current device;
with the device set only afterwards, every rank would start on GPU 0. No GPU is needed to check
the order: both calls are recorded, and the process group is never really started."""

from __future__ import annotations

import pytest
import torch

import planc.runtime.job as job_module
from planc.spec import Layout, build_plan


class _Joined(Exception):
    pass


def test_the_cuda_device_is_set_before_the_process_group_starts(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", str(device))))

    def join(device, timeout=None):
        calls.append(("init_process_group", str(device)))
        raise _Joined

    monkeypatch.setattr(job_module, "init_process_group", join)
    plan = build_plan(
        {
            "model": {"layers": 2, "hidden": 32, "heads": 4, "vocab": 64, "seq_len": 16},
            "hardware": {"device": "H100-SXM"},
            "train": {"global_batch": 8},
        }
    )
    layout = Layout(tp=1, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=1)
    with pytest.raises(_Joined):
        job_module.Job.create(plan, layout, device="cuda:3")
    assert calls == [("set_device", "cuda:3"), ("init_process_group", "cuda:3")]


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        # CUDA: NCCL for CUDA tensors with gloo beside it for CPU ones, bound to the rank's GPU
        ("cuda:3", {"backend": "cuda:nccl,cpu:gloo", "device_id": torch.device("cuda", 3)}),
        ("cpu", {"backend": "gloo"}),  # CPU: unchanged, and device_id is NCCL-only
    ],
)
def test_the_process_group_gets_its_backends_and_device(monkeypatch, device, expected):
    from datetime import timedelta

    joined = []
    monkeypatch.setattr(job_module.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(job_module.dist, "init_process_group", lambda **kwargs: joined.append(kwargs))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "2000")  # leaves the environment as it was
    job_module.init_process_group(torch.device(device), timeout=90)
    assert joined == [{**expected, "timeout": timedelta(seconds=90)}]
