"""One rank of a full-size world in this process: torch's ``fake`` process group and fake tensors.

``planc verify --simulate`` builds the emitted program's job for one rank of the plan's real world
size (512 ranks of a 70B model, here) without a peer process and without memory:

- :func:`fake_process_group` joins the ``fake`` backend
  (``torch.testing._internal.distributed.fake_pg``: every collective returns at once, shapes
  right, values not computed) as rank ``rank`` of ``world_size``;
- the device mesh and the model on the meta device are built *outside* fake tensors
  (``init_device_mesh`` fails inside ``FakeTensorMode``), then :func:`fake_tensors` is entered
  and the job allocates its shards with ``to_empty`` as the real program does, as fake tensors;
- :func:`own_sharding_fake_mode`: DTensor's sharding propagation computes each op's global output
  shape by running it on fake tensors of the *global* shape, in whatever fake mode is active.
  Under our fake mode those would be counted as memory by the tracker (+30 GiB in the gradient
  norm of an 8B model); a :class:`~torch._guards.TracingContext` with a fake mode of its own is
  what ``detect_fake_mode`` consults first, so DTensor's shape arithmetic runs there, unseen;
- :func:`ddp_on_fake_tensors` and :func:`completing_comm_hooks`: ``DistributedDataParallel``
  compares its parameters across processes when it wraps (a C++ check that reads their data) and
  waits on its all-reduce's future for the reduced bucket, which the ``fake`` backend leaves
  empty; the first is skipped (there is no other process to compare with) and the second is the
  same in-place all-reduce on the ``fake`` backend, its future completed with the bucket.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode


@contextlib.contextmanager
def fake_process_group(rank: int, world_size: int) -> Iterator[None]:
    """The default process group is the ``fake`` backend, this process rank ``rank`` of ``world_size``."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("a process group already exists in this process; simulate in a fresh one")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        _forget_dtensor_plans()


def _forget_dtensor_plans() -> None:
    """Empty DTensor's caches of sharding and redistribution plans. They are keyed by device mesh,
    and a mesh equals another of the same shape and dimension names whatever its process groups:
    simulating a second rank in this process (the last pipeline stage after the first) would take
    the first rank's plans, naming process groups destroyed with it."""
    from torch.distributed.tensor._redistribute import _gen_transform_infos
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    _gen_transform_infos.cache_clear()


@contextlib.contextmanager
def fake_tensors() -> Iterator[FakeTensorMode]:
    """Every tensor created inside is a fake one (shape, dtype, device; no storage), and DTensor's
    global-shape propagation has a fake mode of its own (see the module docstring)."""
    from torch._guards import TracingContext, tracing

    with tracing(TracingContext(FakeTensorMode())), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        yield mode


@contextlib.contextmanager
def ddp_on_fake_tensors() -> Iterator[None]:
    """``DistributedDataParallel`` wraps fake parameters: its check that every process holds the
    same parameter shapes (``dist._verify_params_across_processes``, which reads their storage) is
    skipped -- one process simulates one rank, there is no other to compare with."""
    import torch.nn.parallel.distributed as ddp_module

    original = ddp_module._verify_param_shape_across_processes
    ddp_module._verify_param_shape_across_processes = lambda *args, **kwargs: None
    try:
        yield
    finally:
        ddp_module._verify_param_shape_across_processes = original


def completing_comm_hooks(model_parts: list) -> None:
    """Give each ``DistributedDataParallel`` part without a communication hook one that does what
    DDP's default does -- all-reduce the bucket in place and average it -- on the ``fake`` backend,
    returning a future that holds the bucket (the backend's own future holds nothing, on which the
    reducer fails). A hook a plugin registered (``planc-powersgd``) would wait on such futures:
    that is said at once, before the step fails inside it."""
    from torch.nn.parallel import DistributedDataParallel

    for part in model_parts:
        if not isinstance(part, DistributedDataParallel):
            continue
        if part._comm_hooks:
            names = ", ".join(getattr(hook, "__qualname__", repr(hook)) for hook, _ in part._comm_hooks)
            raise RuntimeError(
                f"a plugin's DDP communication hook ({names}) waits on collectives that the fake process "
                "group completes without a result; a plan with it cannot be simulated"
            )
        part.register_comm_hook(part.process_group, _all_reduce_in_place)


def _all_reduce_in_place(group, bucket):  # no return annotation: DDP checks it, and this module's are strings
    buffer = bucket.buffer()
    dist.all_reduce(buffer, group=group)
    buffer.div_(dist.get_world_size(group))
    done: torch.futures.Future = torch.futures.Future()
    done.set_result(buffer)
    return done
