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
  what ``detect_fake_mode`` consults first, so DTensor's shape arithmetic runs there, unseen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
