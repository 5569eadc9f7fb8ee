"""The run-time ``Job``: everything one process needs to train one plan under one layout.

A job is built in three phases, and the emitted program reads as exactly that list::

    job = Job.create(plan, layout)          # 1. process group, device mesh, full model on "meta"
    pipeline.apply(job, ...)                # 2. each active strategy, in composition order,
    tensor_parallel.apply(job, ...)         #    rewrites the (still empty) model parts
    fsdp.apply(job, ...)
    job.init_weights()                      # 3. allocate local shards, initialise them identically
    job.build_optimizer()                   #    for every layout, finish wrapping, build the schedule
    train(job, ...)

Strategies work on the *meta* model, so no process ever holds more than its shard (torchtitan's
order). Some wrappers need real tensors -- DistributedDataParallel broadcasts and buckets them, a
DDP communication hook needs the DDP module -- so they register ``job.after_init(fn)``; those
callbacks run inside :meth:`Job.init_weights`, in the order they were registered (= composition order).

What strategies hand each other goes through typed fields, each set by one strategy and read by
later ones or by the training step (composition order guarantees the writer ran first):

====================  ======================  ===============================================
field                 set by                  read by
====================  ======================  ===============================================
model_parts           pipeline (split), ddp   every later strategy, the step, checkpoints
stage_indices         pipeline                pipeline (schedule), the step
schedule_builder      pipeline                init_weights (builds ``schedule``)
mixed_precision       bf16 (offer)            fsdp, ddp (take), else init_weights (autocast)
loss_parallel         tensor_parallel         the step (loss under ``loss_parallel()``)
sync_controls         ddp, zero1, fsdp        the step (gradient accumulation)
tied_weights          pipeline                the step (gradient sum, clipping)
shard_mesh            fsdp (HSDP)             hangs (the plan's timeout on its groups)
local_shard_specs     ddp, zero1 (over TP)    clipping, checkpoints
partial_sum_shards    ddp, zero1 (TP + SP)    the step (summed over tp before clipping)
optimizer_factory     zero1                   build_optimizer
====================  ======================  ===============================================
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineSchedule
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

from planc.runtime.transformer import Transformer, build_model
from planc.spec import Layout, ParallelDims, Plan
from planc.spec.parallel_dims import MESH_DIM_NAMES

#: ``sync_control(sync) -> context manager``: entered around one micro-batch's forward and backward;
#: ``sync`` is False for every micro-batch but the last of an optimizer step.
SyncControl = Callable[[bool], ContextManager]


@dataclass
class TiedWeight:
    """A weight shared by two pipeline stages (tied embeddings): each holds a copy, their gradients are summed.

    Megatron's scheme (Shoeybi et al. 2019, §3): the first stage owns the embedding, the last
    stage a copy for the output projection; after backward the two gradients are all-reduced over
    ``group`` (the ranks of both stages that share the other coordinates), so both copies take the
    same optimizer step and stay equal. ``counted`` is False on the copy so the gradient norm
    counts the weight once. The weight is looked up on ``module`` each time, because later
    strategies may replace the parameter object (FSDP shards it, DDP over TP localises it).
    """

    module: nn.Module
    name: str
    group: dist.ProcessGroup | None
    counted: bool

    @property
    def param(self) -> nn.Parameter:
        param = self.module._parameters[self.name]
        assert param is not None, f"the tied weight {self.name!r} is gone"
        return param


@dataclass
class MixedPrecision:
    """What ``bf16`` hands on: FSDP2's ``MixedPrecisionPolicy`` (bf16 compute, fp32 reduction), and
    the dtype to autocast the forward to when no strategy applies the policy itself."""

    policy: MixedPrecisionPolicy
    autocast_dtype: torch.dtype
    taken: bool = False
    """Whether a strategy took the policy (then the forward is not autocast)."""


@dataclass
class Job:
    """One process's share of a training run: plan, layout, mesh, model parts, optimizer and hooks."""

    plan: Plan
    layout: Layout
    dims: ParallelDims
    device: torch.device
    mesh: DeviceMesh
    """The ("pp", "dp", "tp") device mesh (:data:`~planc.spec.parallel_dims.MESH_DIM_NAMES`)."""
    shard_mesh: DeviceMesh | None = None
    """Set by ``fsdp`` with a shard group (HSDP): the ("dp_replicate", "dp_shard") mesh. Its groups
    are new ones, not the mesh's "dp" group, so they need the plan's collective timeout of their own."""

    model_parts: list[nn.Module] = field(default_factory=list)
    """The local model chunks: one without pipelining, ``virtual_stages`` with it (a strategy may
    replace an entry with its wrapper, e.g. DistributedDataParallel)."""
    stage_indices: list[int] = field(default_factory=lambda: [0])
    """Pipeline stage index of each entry of ``model_parts``."""
    num_stages: int = 1
    """Pipeline stages in total (pp x virtual_stages)."""

    schedule_builder: Callable[[Job], _PipelineSchedule] | None = None
    """Set by ``pipeline``: builds the pipelining schedule from the final model parts."""
    schedule: _PipelineSchedule | None = None
    """The ``torch.distributed.pipelining`` schedule (None without pipelining)."""
    stages: list[PipelineStage] = field(default_factory=list)
    """The ``PipelineStage`` of each local model part."""

    mixed_precision: MixedPrecision | None = None
    """Offered by ``bf16`` (:meth:`offer_mixed_precision`); a strategy that applies the policy
    itself (``fsdp``) takes it (:meth:`take_mixed_precision`), else the forward is autocast."""
    loss_parallel: bool = False
    """Set by ``tensor_parallel``: logits stay vocabulary-sharded and the loss runs under ``loss_parallel()``."""
    sync_controls: list[SyncControl] = field(default_factory=list)
    """Gradient-synchronisation switches for gradient accumulation (DDP ``no_sync``, FSDP
    ``set_requires_gradient_sync``), combined by :meth:`gradient_sync`."""
    tied_weights: list[TiedWeight] = field(default_factory=list)
    """Weights shared between pipeline stages, summed after backward (see :class:`TiedWeight`)."""
    local_shard_specs: dict[nn.Parameter, DTensorSpec] = field(default_factory=dict)
    """Parameters that hold a tensor-parallel shard as a plain tensor (for DDP and ZeRO-1, which
    cannot take DTensors) -> their DTensor spec, so norms and checkpoints still see the whole."""
    partial_sum_shards: list[nn.Parameter] = field(default_factory=list)
    """Local shards (under DDP) of the norms' replicated parameters under sequence parallelism:
    backward leaves their gradients as this rank's partial sums, and the step sums them over tp,
    all in one all-reduce (:func:`planc.runtime.optim.sum_in_place`)."""
    gradients_in_buckets: bool = False
    """Set by ``ddp`` (DistributedDataParallel): the gradients are views into DDP's buckets, which
    the step zeroes in place instead of setting them to None (a None gradient is created beside
    the bucket: :func:`planc.strategies.ddp.runtime.give_zero_gradients`)."""
    optimizer_factory: Callable[[Optimizer], Optimizer] | None = None
    """Set by ``zero1``: turns the plan's optimizer (built for one model part's parameters) into the
    one to use, e.g. a ZeroRedundancyOptimizer of the same class, groups and settings."""
    optimizers: list[Optimizer] = field(default_factory=list)
    """One optimizer per model part (checkpoints map optimizer state to names through its part)."""
    lr_schedulers: list[LRScheduler] = field(default_factory=list)
    """One learning-rate scheduler per optimizer."""

    _after_init: list[Callable[[Job], None]] = field(default_factory=list, repr=False)
    _initialised: bool = field(default=False, repr=False)
    _trained_parameters: list[nn.Parameter] | None = field(default=None, repr=False)
    """:attr:`local_parameters` as :meth:`build_optimizer` found them (see there)."""

    # -- phase 1 --------------------------------------------------------------------------------

    @classmethod
    def create(cls, plan: Plan, layout: Layout, *, device: str | torch.device | None = None) -> Job:
        """Join (or start) the process group, build the ("pp", "dp", "tp") mesh and the full model on meta.

        ``device`` defaults to this process's CUDA device under torchrun when CUDA is available and
        the plan is not for ``cpu``, else the CPU (gloo).
        """
        from torch.distributed.device_mesh import init_device_mesh

        device = torch.device(device) if device is not None else default_device(plan)
        if device.type == "cuda":
            # Before the process group: NCCL binds its communicators (and any barrier) to the
            # current device, which would otherwise be GPU 0 on every rank (PyTorch's advice in
            # init_process_group's docs; torchtitan does the same). Also when the caller started
            # the process group itself.
            torch.cuda.set_device(device)
        from planc.runtime.hangs import backend_timeout

        # Longer than the plan's timeout: planc's hang monitor reports first (runtime/hangs.py).
        init_process_group(device, timeout=backend_timeout(plan.train.timeout))
        dims = layout.dims
        world = dist.get_world_size()
        if dims.world_size != world:
            # The program was started with another process count (`python train.py`, or another
            # --nproc-per-node): the user's to fix, so one line and status 1 on each rank, not a
            # traceback per rank (as train() refuses steps past the schedule: loop._steps_to_train).
            raise SystemExit(
                f"planc: the layout needs tp x pp x dp = {layout.tp} x {layout.pp} x {layout.dp} = "
                f"{dims.world_size} processes, but this run has {world}; launch with torchrun "
                f"--nproc-per-node {dims.world_size} (the program's docstring has the command), or `planc run`"
            )
        mesh = init_device_mesh(device.type, dims.mesh_shape, mesh_dim_names=MESH_DIM_NAMES)
        model = build_model(plan.model, device="meta")
        return cls(plan=plan, layout=layout, dims=dims, device=device, mesh=mesh, model_parts=[model])

    # -- what strategies use ---------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def coordinates(self) -> dict[str, int]:
        """This process's ``{"pp": i, "dp": j, "tp": k}`` on the mesh (fixed with it, so found once:
        every step reads it)."""
        return dict(self._coordinates)

    @cached_property
    def _coordinates(self) -> dict[str, int]:
        return {name: self.mesh.get_local_rank(name) for name in MESH_DIM_NAMES}

    def group(self, dim: str) -> dist.ProcessGroup:
        """The process group of mesh dimension ``dim`` ("pp", "dp" or "tp") that contains this rank."""
        return self.mesh.get_group(dim)

    @property
    def is_first_stage(self) -> bool:
        return 0 in self.stage_indices

    @property
    def is_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stage_indices

    @property
    def local_parameters(self) -> list[nn.Parameter]:
        """Every distinct parameter of the local model parts.

        Once :meth:`build_optimizer` ran, the list it found: the optimizers hold those very
        parameters, so they are the ones trained (checkpoints swap tensor-parallel shards for a
        moment and put the same ones back: ``dtensor_parameters``). Every step reads the list twice
        (clearing and clipping gradients), and walking the modules took 0.4 ms each time for a
        4-block model on CPU, more with more blocks."""
        if self._trained_parameters is not None:
            return list(self._trained_parameters)
        return self._walk_parameters()

    def _walk_parameters(self) -> list[nn.Parameter]:
        seen: dict[int, nn.Parameter] = {}
        for part in self.model_parts:
            for param in part.parameters():
                seen.setdefault(id(param), param)
        return list(seen.values())

    def transformers(self) -> list[Transformer]:
        """The model parts as the transformer chunks they are (before any wrapper replaced them:
        strategies that split, parallelize or wrap blocks run before data parallelism wraps)."""
        parts = self.unwrapped_parts()
        if not all(isinstance(part, Transformer) for part in parts):
            raise RuntimeError("a model part is not a planc Transformer: apply this strategy before the wrappers")
        return [part for part in parts if isinstance(part, Transformer)]

    def unwrapped_parts(self) -> list[nn.Module]:
        """The model parts without a DistributedDataParallel wrapper (FQNs as in the bare model)."""
        return [getattr(part, "module", part) if _is_ddp(part) else part for part in self.model_parts]

    def after_init(self, callback: Callable[[Job], None]) -> None:
        """Run ``callback(job)`` inside :meth:`init_weights`, once the weights are real and initialised.

        For wrappers that need real tensors (DistributedDataParallel, its communication hooks).
        Runs immediately when the weights are already initialised.
        """
        if self._initialised:
            callback(self)
        else:
            self._after_init.append(callback)

    def offer_mixed_precision(self, policy: MixedPrecisionPolicy, autocast_dtype: torch.dtype) -> None:
        """``bf16``'s hand-over: the FSDP2 policy, and the dtype to autocast the forward to if no
        later strategy takes the policy."""
        self.mixed_precision = MixedPrecision(policy, autocast_dtype)

    def take_mixed_precision(self) -> MixedPrecisionPolicy | None:
        """Hand the ``bf16`` policy to a strategy that applies it itself (FSDP2); the forward is then not autocast."""
        if self.mixed_precision is None:
            return None
        self.mixed_precision.taken = True
        return self.mixed_precision.policy

    @property
    def mp_policy(self) -> MixedPrecisionPolicy | None:
        """The policy ``bf16`` offered (None without bf16)."""
        return self.mixed_precision.policy if self.mixed_precision is not None else None

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype the forward runs under autocast: bf16's, unless a strategy took its policy."""
        mp = self.mixed_precision
        return mp.autocast_dtype if mp is not None and not mp.taken else None

    # -- phase 3 ---------------------------------------------------------------------------------

    def init_weights(self, data_root: str | None = None) -> None:
        """Allocate every local shard on the device and give it its layout-independent initial value
        (or ``init = pretrained``'s weights: a relative path under ``data_root``, default the plan's).

        Then run the ``after_init`` callbacks (e.g. DDP wrapping), autocast the forward when
        ``bf16`` asked for it and no strategy took its policy, and build the pipeline schedule.
        """
        if self._initialised:
            raise RuntimeError("init_weights() was already called for this job")
        from planc.weights.import_hf import initialise  # seeded init, or init = pretrained's weights

        seed = self.plan.train.seed
        for part in self.unwrapped_parts():
            part.to_empty(device=self.device)
            initialise(part, self.plan.model, seed, root=data_root or self.plan.data_root)
        self._initialised = True
        callbacks, self._after_init = self._after_init, []
        for callback in callbacks:
            callback(self)
        if self.autocast_dtype is not None:
            for part in self.unwrapped_parts():
                _autocast_forward(part, self.device.type, self.autocast_dtype)
        if self.schedule_builder is not None:
            self.schedule = self.schedule_builder(self)

    def build_optimizer(self) -> None:
        """The plan's optimizer and learning-rate schedule for each model part (through
        ``optimizer_factory`` when a strategy set one)."""
        from planc.runtime.optim import build_lr_scheduler, build_optimizer

        if not self._initialised:
            raise RuntimeError("call job.init_weights() before job.build_optimizer()")
        self.optimizers, self.lr_schedulers = [], []
        for part in self.model_parts:
            optimizer = build_optimizer(part.parameters(), self.plan.train)
            if self.optimizer_factory is not None:
                optimizer = self.optimizer_factory(optimizer)
            self.optimizers.append(optimizer)
            self.lr_schedulers.append(build_lr_scheduler(optimizer, self.plan.train))
        self._trained_parameters = self._walk_parameters()

    # -- what a training step uses -----------------------------------------------------------------

    @contextlib.contextmanager
    def gradient_sync(self, sync: bool) -> Iterator[None]:
        """Enter every registered sync control: gradients are reduced across data parallel only when ``sync``."""
        with contextlib.ExitStack() as stack:
            for control in self.sync_controls:
                stack.enter_context(control(sync))
            yield

    def loss_context(self) -> ContextManager:
        """``loss_parallel()`` when the logits are vocabulary-sharded, else nothing."""
        if self.loss_parallel:
            from torch.distributed.tensor.parallel import loss_parallel

            return loss_parallel()
        return contextlib.nullcontext()


def default_device(plan: Plan) -> torch.device:
    if not plan.hardware.is_cpu and torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


#: CUDA's backends: NCCL for CUDA tensors, gloo beside it for CPU ones (barriers, object collectives).
CUDA_BACKEND = "cuda:nccl,cpu:gloo"


def init_process_group(device: torch.device, timeout: float | None = None) -> None:
    """Join the torchrun process group (gloo on CPU; NCCL plus gloo on CUDA); a lone process gets a group of one.

    ``timeout`` (seconds): how long a collective may wait (see :mod:`planc.runtime.hangs`); the
    flight recorder is switched on first, so that a timeout can name the collective.

    On CUDA, ``device_id`` binds the group to this rank's GPU: NCCL then forms its communicator at
    once (set-up errors surface here, not in step 1) and splits the mesh's subgroups from it instead
    of bootstrapping each through the store, and ``barrier()`` needs no guess of the device
    (``init_process_group``'s docs on ``device_id``, torch 2.13). The ``cpu:gloo`` half carries
    barriers and object collectives (DCP's planning, resume's votes) as CPU pickles instead of
    pickles copied through GPU memory (``_get_object_coll_device`` picks gloo when the group has it).
    """
    if dist.is_initialized():
        return
    from datetime import timedelta

    from planc.runtime.hangs import enable_flight_recorder

    enable_flight_recorder()
    kwargs: dict = {"backend": "gloo"}
    if device.type == "cuda":
        kwargs = {"backend": CUDA_BACKEND, "device_id": device}
    limit = timedelta(seconds=timeout) if timeout is not None else None  # None: torch's default
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(**kwargs, timeout=limit)
    else:  # not under torchrun: a single process with an in-memory store
        dist.init_process_group(**kwargs, store=dist.HashStore(), rank=0, world_size=1, timeout=limit)


def _is_ddp(module: nn.Module) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(module, DistributedDataParallel)


def _autocast_forward(module: nn.Module, device_type: str, dtype: torch.dtype) -> None:
    """Run ``module``'s forward under ``torch.autocast`` (an instance attribute: names and wrappers unchanged).

    Only the forward is autocast, as PyTorch recommends; backward ops run in the dtypes the forward
    chose, and activation recomputation restores the autocast state it saw.
    """
    module.forward = torch.autocast(device_type=device_type, dtype=dtype)(module.forward)
