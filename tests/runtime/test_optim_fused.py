"""The optimizer takes torch's fused kernel exactly when every parameter is on one CUDA or CPU device."""

from types import SimpleNamespace

import torch

from planc.runtime.optim import build_optimizer, runs_fused
from planc.spec.train import TrainSpec


def _on(device: str):
    return SimpleNamespace(device=torch.device(device))


def test_fused_when_every_parameter_is_on_cuda_or_every_one_on_cpu():
    assert runs_fused([_on("cuda"), _on("cuda")])
    assert runs_fused([_on("cpu"), _on("cpu")])
    assert not runs_fused([_on("cuda"), _on("cpu")])  # mixed: torch's fused kernels refuse it
    assert not runs_fused([_on("meta")])
    assert not runs_fused([])


def test_cpu_parameters_take_the_fused_kernel_and_step_as_the_loop_does():
    """Fused Adam, AdamW and SGD on CPU: one kernel per group where torch's default loops over the
    tensors in Python. The same update as the loop's (torch.optim with ``fused=False``, the
    reference), to float32 rounding, over two steps with weight decay on one group."""
    for name in ("adamw", "adam", "sgd"):
        train = TrainSpec(global_batch=1, optimizer=name, lr=1e-2, weight_decay=0.1)
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 4)
        reference = torch.nn.Linear(4, 4)
        reference.load_state_dict(model.state_dict())
        optimizer = build_optimizer(model.parameters(), train)
        assert all(group["fused"] for group in optimizer.param_groups), name
        looped = build_optimizer(reference.parameters(), train)
        for group in looped.param_groups:
            group["fused"] = False
        for _ in range(2):
            for net in (model, reference):
                net.weight.grad = torch.arange(16.0).reshape(4, 4) / 16
                net.bias.grad = torch.ones(4)
            optimizer.step()
            looped.step()
        for mine, theirs in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(mine, theirs)
