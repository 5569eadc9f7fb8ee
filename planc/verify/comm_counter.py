"""Count the bytes every collective of a step moves, by kind and mesh dimension.

A :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees each c10d op (``c10d::allreduce_``,
``_allgather_base_``, ``send`` ... -- what ``torch.distributed``'s Python API, DDP's reducer,
ZeroRedundancyOptimizer, FSDP2 and the pipelining schedules call: since torch 2.0 every
``ProcessGroup`` method goes through the dispatcher) and each functional collective
(``_c10d_functional::all_reduce`` ... -- what DTensor redistributions and tensor parallelism
use). When an op's arguments include a DTensor the mode returns ``NotImplemented``, so DTensor
first lowers it to the collectives on local tensors, which then come back through the mode
(the same arrangement as torch's own ``CommDebugMode``).

A dispatch mode is the thread's own, and some collectives are issued from another thread: a
future's callback runs where the future completes (gloo's or NCCL's completion thread), and DDP
communication hooks chain collectives that way -- PowerSGD's P and Q all-reduces, which a first
version missed (it counted only the uncompressed part, a quarter of the bytes). While counting,
``torch.Future.then`` therefore wraps each callback in a counter of its own that adds to the same
totals.

Bytes are counted the way the cost model states volumes (:mod:`planc.cost.comm`): what one
device sends, for a buffer of ``n`` bytes (the full, unsharded size) over a group of ``p``:
all-reduce ``2 (p-1)/p n``, all-gather and reduce-scatter ``(p-1)/p n``, broadcast ``(p-1)/p n``
(every rank broadcasts its share in turn), point-to-point: the bytes sent plus received (the
cost model counts both directions of a stage's link).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: c10d op -> (kind, index of the argument that holds the full buffer): the inputs of all-reduce,
#: reduce-scatter and all-to-all, the output of all-gather, the tensors sent or received.
_C10D = {
    "allreduce_": ("all_reduce", 0),
    "allreduce_coalesced_": ("all_reduce", 0),
    "allgather_": ("all_gather", 0),
    "_allgather_base_": ("all_gather", 0),
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "allgather_coalesced_": ("all_gather", 0),
    "reduce_scatter_": ("reduce_scatter", 1),
    "_reduce_scatter_base_": ("reduce_scatter", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "broadcast_": ("broadcast", 0),
    "alltoall_base_": ("all_to_all", 1),
    "alltoall_": ("all_to_all", 1),
    "send": ("send", 0),
    "recv_": ("recv", 0),
    "recv_any_source_": ("recv", 0),
}
_FUNCTIONAL = {
    "all_reduce": "all_reduce",
    "all_reduce_": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all",
    "broadcast": "broadcast",
    "broadcast_": "broadcast",
}
_FACTOR = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "broadcast": 1.0, "all_to_all": 1.0}


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class CommCounter(TorchDispatchMode):
    """``with CommCounter(names) as counter: ...`` then ``counter.bytes[(kind, dim)]`` (bytes sent
    per device, as above) and ``counter.calls[(kind, dim)]``.

    ``names`` maps a process group's name (``ProcessGroup.group_name``) to the mesh dimension it
    serves ("dp", "tp", "pp"); other groups are reported under "world" or "other".
    """

    def __init__(self, names: dict[str, str], sizes: dict[str, int]):
        super().__init__()
        self.names, self.sizes = names, sizes
        self.bytes: dict[tuple[str, str], float] = defaultdict(float)
        self.calls: dict[tuple[str, str], int] = defaultdict(int)
        self._lock = threading.Lock()
        self._then: Any = None  # torch.Future.then while this counter follows callbacks
        self._follows_callbacks = True

    def __enter__(self):
        """Count in this thread, and in every callback a future gets meanwhile (see the module)."""
        if self._follows_callbacks:
            original = self._then = torch._C.Future.then
            here = threading.get_ident()

            def then(future, callback):
                def counted(completed):
                    if threading.get_ident() == here:  # run inline (the future had completed): counted here
                        return callback(completed)
                    with self._sibling():
                        return callback(completed)

                return original(future, counted)

            setattr(torch._C.Future, "then", then)  # noqa: B010 (a method of a C++ class, for this block only)
        return super().__enter__()

    def __exit__(self, *exc):
        if self._follows_callbacks:
            setattr(torch._C.Future, "then", self._then)  # noqa: B010
        return super().__exit__(*exc)

    def _sibling(self) -> CommCounter:
        """A counter for another thread that adds to this one's totals (a mode instance is entered
        on one thread at a time); the patch of ``then`` stays this one's."""
        sibling = CommCounter(self.names, self.sizes)
        sibling.bytes, sibling.calls, sibling._lock = self.bytes, self.calls, self._lock
        sibling._follows_callbacks = False
        return sibling

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(t.__name__ == "DTensor" for t in types):
            return NotImplemented  # let DTensor lower the op to collectives on local tensors first
        namespace = func.namespace
        name = func.overloadpacket.__name__
        if namespace == "c10d" and name in _C10D:
            self._count_c10d(name, args)
        elif namespace == "_c10d_functional" and name in _FUNCTIONAL:
            self._count_functional(name, args)
        return func(*args, **kwargs)

    def _record(self, kind: str, group: str, nbytes: float, size: int | None = None) -> None:
        """``size``: the group's own size where the op names its group (a c10d op); else the mesh
        dimension's."""
        size = size if size is not None else self.sizes.get(group, 1)
        if kind in _FACTOR:
            nbytes = _FACTOR[kind] * (size - 1) / size * nbytes if size > 1 else 0.0
        with self._lock:  # a sibling may count at the same time
            self.bytes[(kind, group)] += nbytes
            self.calls[(kind, group)] += 1

    def _group_of(self, value) -> str:
        return self.names.get(value, "other") if isinstance(value, str) else "other"

    def _c10d_group(self, boxed) -> tuple[str, int | None]:
        """(mesh dimension or "other", size) of the process group a c10d op carries, boxed as a
        ScriptObject: its own size, so that a group of two ranks inside a larger dimension (the
        tied embedding's first and last pipeline rank) counts as two."""
        import torch.distributed as dist

        try:
            group = dist.ProcessGroup.unbox(boxed)
        except (RuntimeError, TypeError, AttributeError):
            return "other", None
        return self.names.get(group.group_name, "other"), group.size()

    def _count_c10d(self, name: str, args) -> None:
        kind, index = _C10D[name]
        boxed = next((a for a in args if isinstance(a, torch.ScriptObject)), None)
        group, size = self._c10d_group(boxed) if boxed is not None else ("other", None)
        self._record(kind, group, _nbytes(_tensors(args[index])), size)

    def _count_functional(self, name: str, args) -> None:
        kind = _FUNCTIONAL[name]
        group = self._group_of(next((a for a in args if isinstance(a, str) and a not in _REDUCE_OPS), None))
        size = self.sizes.get(group, 1)
        nbytes = _nbytes(_tensors(args[0]))
        if kind == "all_gather":
            nbytes *= size  # the input is this rank's share; the full buffer is p of them
        self._record(kind, group, nbytes)


_REDUCE_OPS = {"sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum"}


def group_names(job) -> tuple[dict[str, str], dict[str, int]]:
    """(process-group name -> "dp"/"tp"/"pp"/"world", name -> group size) for ``job``'s mesh."""
    import torch.distributed as dist

    names: dict[str, str] = {}
    sizes: dict[str, int] = {}
    world = dist.group.WORLD
    if world is not None:
        names[str(world.group_name)] = "world"
        sizes["world"] = dist.get_world_size()
    for dim in ("pp", "dp", "tp"):  # a dimension spanning the world is named for the dimension
        group = job.group(dim)
        name = str(group.group_name)
        if dist.get_world_size(group) > 1 or name not in names:
            names[name] = dim
        sizes[dim] = dist.get_world_size(group)
    for tied in job.tied_weights:  # the first and the last pipeline rank: the pipeline's traffic
        if tied.group is not None:
            names[str(tied.group.group_name)] = "pp"
    hybrid = getattr(job, "shard_mesh", None)  # HSDP: the "dp" ranks unflattened into replicate x shard
    if hybrid is not None:
        for axis in range(hybrid.ndim):  # groups of their own (a c10d op carries its group's size)
            names[str(hybrid.get_group(axis).group_name)] = "dp"
    return names, sizes
