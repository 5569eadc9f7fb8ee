"""DistributedDataParallel (and ZeroRedundancyOptimizer) over tensor-parallel shards.

DDP and ZeroRedundancyOptimizer move plain tensors with c10d collectives; they cannot take the
DTensor parameters that ``parallelize_module`` creates (DDP's own 2-D workaround,
``torch.distributed.tensor.parallel.ddp._pre_dp_module_transform``, re-registers a DTensor as a
non-parameter attribute in its pre-forward hook, so the module loses its parameters after the
first forward in torch 2.13). Megatron-LM's arrangement is the working one: a TP rank's
parameters *are* its local shards. So, before DDP wraps a model part:

* every DTensor parameter is replaced by a plain ``nn.Parameter`` holding its local shard
  (same storage, same name), and its DTensor spec is remembered in ``job.local_shard_specs``;
* a forward pre-hook puts a DTensor view of the shard (``DTensor.from_local``, no copy, no
  communication) in front of the parameter for the duration of the module's forward, so the
  tensor-parallel layers still compute with DTensors; autograd carries the gradient back to the
  plain parameter, where DDP's hooks see it.

Gradient norms read the spec beside the plain gradient (``planc.runtime.grad_norm``);
checkpoints rebuild the DTensor from it (:func:`as_dtensor`). The ``ddp`` strategy
(``planc.strategies.ddp.runtime``) localizes a part before it wraps it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def localize_dtensor_parameters(module: nn.Module, specs: dict, partial_sums: list | None = None) -> int:
    """Swap every DTensor parameter under ``module`` for its local shard; return how many were swapped.

    ``partial_sums``: under sequence parallelism, the norms' parameters (replicated, applied to a
    sequence shard) are appended to it, and their DTensor views hand backward's partial sums to the
    local shard as they are (``grad_placements``): the step sums them over tp once, all together
    (:func:`planc.runtime.optim.sum_in_place`). Left to ``from_local``'s default, each one was summed by
    an all-reduce of its own, in every micro-batch's backward."""
    from torch.distributed.tensor import DTensor

    replaced: dict[int, nn.Parameter] = {}  # a tied parameter stays one parameter
    count = 0
    for sub in module.modules():
        local_specs = {}
        partial = partial_sums is not None and isinstance(sub, (nn.LayerNorm, nn.RMSNorm))
        for name, param in list(sub.named_parameters(recurse=False)):
            if not isinstance(param, DTensor):
                continue
            local = replaced.get(id(param))
            if local is None:
                local = nn.Parameter(param.to_local().detach(), requires_grad=param.requires_grad)
                replaced[id(param)] = local
                specs[local] = param._spec
                count += 1
                if partial and partial_sums is not None:
                    partial_sums.append(local)
            sub._parameters[name] = local
            local_specs[name] = param._spec
        if local_specs:
            sub.register_forward_pre_hook(_show_dtensors(local_specs, partial))
            sub.register_forward_hook(_hide_dtensors(tuple(local_specs)))
    return count


def _show_dtensors(specs: dict[str, Any], partial_grads: bool = False):
    def hook(module: nn.Module, args) -> None:
        from torch.distributed.tensor import DTensor, Partial

        for name, spec in specs.items():
            # An instance attribute shadows the registered parameter for attribute access only:
            # named_parameters(), DDP and the optimizer keep seeing the plain local shard.
            local = module._parameters[name]
            assert local is not None, f"parameter {name!r} was removed from its module"
            module.__dict__[name] = DTensor.from_local(
                local,
                spec.mesh,
                spec.placements,
                run_check=False,
                shape=spec.shape,
                stride=spec.stride,
                grad_placements=[Partial()] * len(spec.placements) if partial_grads else None,
            )

    return hook


def _hide_dtensors(names: tuple[str, ...]):
    def hook(module: nn.Module, args, output) -> None:
        for name in names:
            module.__dict__.pop(name, None)

    return hook


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's values on this rank: a DTensor's local tensor, or the tensor itself.

    ``_local_tensor``, not ``to_local()``: the latter is an autograd function, ~10 µs a call (the
    gradient norm reads every gradient's each step)."""
    return tensor._local_tensor if hasattr(tensor, "_local_tensor") else tensor


def as_dtensor(tensor: torch.Tensor, spec) -> torch.Tensor:
    """The DTensor whose local shard is ``tensor`` (shares storage; for norms and checkpoints)."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(tensor, spec.mesh, spec.placements, run_check=False, shape=spec.shape, stride=spec.stride)


@contextlib.contextmanager
def dtensor_parameters(job) -> Iterator[None]:
    """For the duration: every local tensor-parallel shard is a DTensor parameter again, in the
    modules and in the optimizers (their state too), sharing storage with the plain shard.

    So ``torch.distributed.checkpoint`` sees tensor-parallel shards as the DTensors they are and
    saves (and reshards on load) the whole matrix, not one rank's piece under the full name.
    Values loaded in place land in the plain shards; anything an optimizer replaced is copied back.
    """
    if not job.local_shard_specs:
        yield
        return
    from torch.distributed.tensor import DTensor

    swapped: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}  # id(local) -> (local, dtensor param)
    for part in job.unwrapped_parts():
        for sub in part.modules():
            for name, param in list(sub._parameters.items()):
                spec = job.local_shard_specs.get(param) if param is not None else None
                if spec is None:
                    continue
                if id(param) not in swapped:
                    swapped[id(param)] = (
                        param,
                        nn.Parameter(as_dtensor(param.data, spec), requires_grad=param.requires_grad),
                    )
                sub._parameters[name] = swapped[id(param)][1]
    optimizers = [_inner(o) for o in job.optimizers]
    for optimizer in optimizers:
        _swap_optimizer(
            optimizer,
            {id(local): (local, view) for local, view in swapped.values()},
            lambda t, local: as_dtensor(t, job.local_shard_specs[local]) if t.shape == local.shape else t,
        )
    try:
        yield
    finally:
        back: dict[int, tuple[Any, nn.Parameter]] = {id(view): (view, local) for local, view in swapped.values()}
        for optimizer in optimizers:
            _swap_optimizer(optimizer, back, lambda t, view: t.to_local() if isinstance(t, DTensor) else t)
        for part in job.unwrapped_parts():
            for sub in part.modules():
                for name, param in list(sub._parameters.items()):
                    if param is not None and id(param) in back:
                        view, local = back[id(param)]
                        if view.to_local().data_ptr() != local.data_ptr():
                            with torch.no_grad():
                                local.copy_(view.to_local())
                        sub._parameters[name] = local


def _inner(optimizer):
    """The optimizer that holds this rank's state (ZeroRedundancyOptimizer keeps it in ``.optim``)."""
    return getattr(optimizer, "optim", optimizer)


def _swap_optimizer(optimizer, mapping: dict, convert) -> None:
    """Replace parameters in ``optimizer``'s groups and state by ``mapping[id(p)][1]``, converting
    state tensors with ``convert(tensor, old_param)``."""
    for group in optimizer.param_groups:
        # In place: ZeroRedundancyOptimizer's partition cache holds these very lists.
        group["params"][:] = [mapping[id(p)][1] if id(p) in mapping else p for p in group["params"]]
    for old, new in mapping.values():
        if old in optimizer.state:
            state = optimizer.state.pop(old)
            optimizer.state[new] = {k: convert(v, old) if isinstance(v, torch.Tensor) else v for k, v in state.items()}
