"""The optimizer takes torch's fused kernel exactly when every parameter is on a CUDA device."""

from types import SimpleNamespace

import torch

from planc.runtime.optim import build_optimizer, runs_fused
from planc.spec.train import TrainSpec


def _on(device: str):
    return SimpleNamespace(device=torch.device(device))


def test_fused_only_when_every_parameter_is_on_cuda():
    assert runs_fused([_on("cuda"), _on("cuda")])
    assert not runs_fused([_on("cuda"), _on("cpu")])  # mixed: torch's fused kernels refuse it
    assert not runs_fused([_on("cpu")])
    assert not runs_fused([])


def test_cpu_parameters_keep_torchs_default_loop():
    for name in ("adamw", "adam", "sgd"):
        train = TrainSpec(global_batch=1, optimizer=name, lr=1e-3)
        optimizer = build_optimizer(torch.nn.Linear(4, 4).parameters(), train)
        assert all(not group["fused"] for group in optimizer.param_groups), name
