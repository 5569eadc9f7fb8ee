"""The :class:`CostContext`: everything a cost pass needs to know about one layout.

A context is the layout's geometry, worked out once: parameters per pipeline rank and TP
shard, micro-batches and tokens per micro-batch, the dtypes the program runs in, per-micro-batch
compute times of a block and of each representative rank, activation bytes per block, and the
links of the tp / dp / pp process groups on the hardware graph. Passes read it and never change
it.

:class:`ContextCache` memoises the parts shared between layouts of one plan (group links,
stage splits, block times), so the planner pays for each only once.
"""

from __future__ import annotations

from dataclasses import dataclass

from planc.cost.comm import step_summary_seconds
from planc.cost.compute import (
    Device,
    LayerTimes,
    block_times,
    device_for,
    embedding_times,
    head_times,
)
from planc.cost.memory import (
    LayerActivations,
    LossKind,
    bf16_weights,
    ddp_replicates,
    layer_activation_bytes,
    local_logits,
    logits_bytes,
    loss_kind,
    micro_batches_holding_logits,
    runtime_state_bytes,
)
from planc.cost.params import StageParams, stage_params
from planc.cost.profile import PLANC_RUNTIME, RuntimeProfile, StateBytes, on_hardware
from planc.hardware.topology import GroupLink, Topology, group_ranks, topology_for
from planc.spec.layout import Layout
from planc.spec.plan import Plan
from planc.stages import StageStyle, freed_before_the_first_stage_backward, micro_batches, representative_ranks


@dataclass(frozen=True, slots=True)
class StageTimes:
    """Per-micro-batch seconds of one pipeline rank (all its chunks, embedding/head included)."""

    rank: int
    forward: float
    backward: float
    backward_weight: float
    """Weight-gradient GEMMs only (zero-bubble's W)."""


@dataclass(frozen=True, slots=True)
class CostContext:
    """One layout of one plan, ready to be costed."""

    plan: Plan
    layout: Layout
    profile: RuntimeProfile
    stages: tuple[StageParams, ...]
    """Representative pipeline ranks (first, second, last), per TP shard."""
    stage_style: StageStyle
    """Where the pipeline stages sit (:mod:`planc.stages`): looped, or V-shaped under ZBV."""
    times: tuple[StageTimes, ...]
    """Per-micro-batch times of the same ranks."""
    micro_batches: int
    """Micro-batches per optimizer step on one data-parallel rank: global_batch / (dp x b)."""
    tokens_per_microbatch: int
    compute_bytes: int
    """Bytes per element the GEMMs and saved activations use (bf16 2, fp32 4)."""
    residual_bytes: int
    """Bytes per element of the residual stream (fp32 under autocast)."""
    grad_reduce_bytes: int
    """Bytes per gradient element in data-parallel reductions (fp32)."""
    state_bytes: StateBytes
    device: Device
    layer: LayerTimes
    """One block, one micro-batch, one device."""
    layer_act: LayerActivations
    """Activation bytes of one block per micro-batch, per recomputation variant."""
    logits: float
    """Logits + loss bytes of one micro-batch on the last stage."""
    links: dict
    """GroupLink per group: "tp", "dp", "pp" (collectives), "pp_hop_counts" (the links of the hops
    between pipeline stages a micro-batch crosses, as (link, how many hops) pairs), "pp_p2p" (the
    slowest of them), "pp_ends" (the first and the last pipeline rank, two ranks) and "world" (every
    rank: the step's summary)."""
    capacity: float
    """Memory per device, bytes."""
    summary_seconds: float
    """The step's summary collective over every rank (:func:`~planc.cost.comm.step_summary_seconds`)."""

    @property
    def model(self):
        return self.plan.model

    @property
    def autocast(self) -> bool:
        """bf16 compute over fp32 parameters (``torch.autocast``; planc's bf16 without FSDP2 or
        ``replicate``): its casts are ops of their own."""
        return self.compute_bytes == 2 and self.residual_bytes == 4

    @property
    def head_output_bytes(self) -> float:
        """Bytes of one micro-batch's logits as the output head writes them on one device: the
        tokens x the local vocabulary (vocabulary-parallel under TP), in compute precision."""
        return self.compute_bytes * local_logits(self.model, self.layout.micro_batch, self.layout.tp)

    @property
    def loss(self) -> LossKind:
        """The loss this layout's program runs (:func:`~planc.cost.memory.loss_kind`)."""
        lay = self.layout
        return loss_kind(self.profile.loss, lay.pp, lay.schedule, lay.tp)

    @property
    def micro_batches_holding_logits(self) -> int:
        """Micro-batches whose logits the head's stage holds at its peak
        (:func:`~planc.cost.memory.micro_batches_holding_logits`)."""
        lay = self.layout
        return micro_batches_holding_logits(lay.schedule, lay.pp, self.micro_batches, self.loss, self.stage_style)

    @property
    def boundary_bytes(self) -> float:
        """Bytes of the tensor one pipeline stage hands the next per micro-batch (per device).

        The residual stream (tokens x h); under sequence parallelism, or with Megatron's
        scatter/gather optimization, each TP rank sends its 1/t.
        """
        full = self.residual_bytes * self.tokens_per_microbatch * self.model.hidden
        lay = self.layout
        if lay.sequence_parallel or (self.profile.p2p_scatter_gather and lay.tp > 1):
            return full / lay.tp
        return full

    @property
    def stages_by_pp_rank(self) -> tuple[StageParams, ...]:
        """Every pipeline rank's stage in rank order where the context holds them all and there
        are several (``planc verify``'s, :class:`ContextCache` ``every_rank``); else ``()``: the
        passes then state no bytes per rank (:attr:`~planc.cost.estimate.CommCost.volume_by_pp_rank`)."""
        pp = self.layout.pp
        if pp == 1 or len(self.stages) != pp:
            return ()
        return tuple(sorted(self.stages, key=lambda st: st.rank))

    @property
    def slowest(self) -> StageTimes:
        """The rank whose micro-batch takes longest: it sets the pipeline's pace."""
        return max(self.times, key=lambda t: t.forward + t.backward)

    def chunk_activations(self, stage: StageParams) -> float:
        """Bytes one micro-batch's blocks save on one of ``stage``'s chunks (the whole stage
        without virtual stages): what a micro-batch's backward of that chunk has freed by its end."""
        return self.layer_act.under(self.layout.recompute) * stage.layers / self.layout.virtual_stages

    def freed_before_the_embedding_backward(self, stage: StageParams, act_layers: float) -> float:
        """Bytes of activations freed between the peak of ``stage`` (first rank, holding
        ``act_layers`` block-micro-batches) and its first embedding backward beyond that backward's
        own finished micro-batch (:func:`~planc.stages.freed_before_the_first_stage_backward`):
        what the embedding's gradient, made there, counts against. An FSDP plan of Llama 3 70B cut
        to 16 layers (TP 8 x PP 4 x DP 2, v = 2, 4 micro-batches) priced its 5 GiB whole-vocabulary
        gradient beside all 8 stage-micro-batches its first rank holds, where 4 are left (with
        the gradients there, :func:`~planc.cost.data_parallel.gained_by_the_embedding_backward`:
        +19.4 % before, +0.4 %)."""
        if not stage.embedding or not stage.layers:
            return 0.0
        lay = self.layout
        held = act_layers * lay.virtual_stages / stage.layers
        freed = freed_before_the_first_stage_backward(lay.schedule, lay.pp, self.micro_batches, held)
        return freed * self.chunk_activations(stage)

    def stage(self, rank: int) -> StageParams:
        for s in self.stages:
            if s.rank == rank:
                return s
        raise KeyError(rank)


def dtypes(plan: Plan, zero: int, dp: int, profile: RuntimeProfile) -> tuple[int, int]:
    """(compute bytes, residual bytes) of the program.

    bf16 under ``torch.autocast`` (ZeRO-1, or no data parallelism): GEMMs in bf16, but the
    parameters, the embedding output and hence the residual stream stay fp32. The bf16
    parameters of FSDP2's policy (DDP via ``replicate``, ZeRO-2/3 via ``fully_shard``) make the
    whole forward bf16 (:func:`~planc.cost.memory.bf16_weights`).
    """
    if plan.train.precision == "fp32":
        return 4, 4
    residual = profile.residual_bytes or (
        2 if bf16_weights(plan.train.precision, zero, dp, ddp_replicates(plan)) else 4
    )
    return 2, residual


class ContextCache:
    """Memoised pieces of contexts for one plan and profile."""

    def __init__(self, plan: Plan, profile: RuntimeProfile = PLANC_RUNTIME, every_rank: bool = False) -> None:
        self.plan = plan
        self.every_rank = every_rank
        """Whether contexts hold every pipeline rank's stage, not only the representative ones that
        bound the others (``planc verify``, which holds each rank against its own prediction)."""
        self.profile = on_hardware(profile, plan.hardware.is_cpu)
        self.topology: Topology = topology_for(plan.hardware)
        self.device = device_for(plan.hardware, plan.train.precision)
        self._stages: dict = {}
        self._links: dict = {}
        self._blocks: dict = {}
        self._edges: dict = {}
        self.world_link: GroupLink = self.topology.world()
        """The link of a collective over every rank."""
        self.summary_seconds = step_summary_seconds(self.world_link)
        """The step's summary over every rank (the same for every layout of the plan)."""

    def stages(self, tp: int, pp: int, v: int, style: StageStyle = "looped") -> tuple[StageParams, ...]:
        key = (tp, pp, v, style)
        found = self._stages.get(key)
        if found is None:
            model = self.plan.model
            ranks = range(pp) if self.every_rank else representative_ranks(pp, style)
            found = tuple(stage_params(model, tp, pp, v, r, style) for r in ranks)
            self._stages[key] = found
        return found

    def links(self, layout: Layout, style: StageStyle = "looped") -> dict:
        """The layout's group links, its pipeline's placed by ``style`` (which hops it crosses)."""
        key = (layout.tp, layout.dp, layout.pp, layout.shard_group, layout.virtual_stages, style)
        found = self._links.get(key)
        if found is None:
            dims, topo, v = layout.dims, self.topology, layout.virtual_stages
            found = {
                "tp": topo.group("tp", dims),
                "dp": topo.group("dp", dims),
                "pp": topo.group("pp", dims),
                "pp_p2p": topo.pipeline_p2p(dims, v, style),
                "pp_hop_counts": topo.pipeline_hop_counts(dims, v, style),
                "world": self.world_link,
            }
            # The first and the last pipeline rank (the tied embedding's gradient sum, pipeline/runtime.py).
            pp_ranks = group_ranks("pp", dims)
            found["pp_ends"] = topo.link_of([pp_ranks[0], pp_ranks[-1]] if layout.pp > 1 else pp_ranks)
            if layout.shard_group:
                # HSDP splits the dp group (ranks dp_rank * tp apart) into shard groups of adjacent
                # dp ranks and replicate groups of every shard_group-th one (mesh order, fsdp/runtime.py).
                dp_ranks = group_ranks("dp", dims)
                found["dp_shard"] = topo.link_of(dp_ranks[: layout.shard_group])
                found["dp_replicate"] = topo.link_of(dp_ranks[:: layout.shard_group])
            self._links[key] = found
        return found

    def block(self, b: int, tp: int, sp: bool, e: int, r: int) -> tuple[LayerTimes, LayerActivations]:
        key = (b, tp, sp, e, r)
        found = self._blocks.get(key)
        if found is None:
            model, profile = self.plan.model, self.profile
            found = (
                block_times(model, b, tp, sp, self.device, e, r, profile),
                layer_activation_bytes(model, b, tp, sp, e, r, profile),
            )
            self._blocks[key] = found
        return found

    def edges(self, b: int, tp: int, sp: bool, e: int, r: int, pp: int, schedule: str | None) -> tuple:
        """(embedding fwd, bwd), (head fwd, bwd) and logits bytes for one micro-batch."""
        loss = loss_kind(self.profile.loss, pp, schedule, tp)
        key = (b, tp, sp, e, r, loss)
        found = self._edges.get(key)
        if found is None:
            model = self.plan.model
            found = (
                embedding_times(model, b, tp, self.device, r),
                head_times(model, b, tp, sp, self.device, e, r, loss),
                logits_bytes(model, b, tp, e, loss=loss),
            )
            self._edges[key] = found
        return found


def build_context(
    plan: Plan,
    layout: Layout,
    profile: RuntimeProfile = PLANC_RUNTIME,
    cache: ContextCache | None = None,
    stage_style: StageStyle = "looped",
) -> CostContext:
    """Work out the geometry of ``layout`` for ``plan``, its pipeline stages placed by ``stage_style``."""
    profile = on_hardware(profile, plan.hardware.is_cpu)
    if cache is None or cache.plan is not plan or cache.profile is not profile:
        cache = ContextCache(plan, profile)
    lay = layout
    e, r = dtypes(plan, lay.zero, lay.dp, profile)
    b, tp, sp = lay.micro_batch, lay.tp, lay.sequence_parallel
    layer, layer_act = cache.block(b, tp, sp, e, r)
    (emb_f, emb_b), (head_f, head_b), logits = cache.edges(b, tp, sp, e, r, lay.pp, lay.schedule)
    stages = cache.stages(tp, lay.pp, lay.virtual_stages, stage_style)
    times = []
    for st in stages:
        fwd = st.layers * layer.forward + (emb_f if st.embedding else 0.0) + (head_f if st.head else 0.0)
        bwd = st.layers * layer.backward + (emb_b if st.embedding else 0.0) + (head_b if st.head else 0.0)
        times.append(
            StageTimes(rank=st.rank, forward=fwd, backward=bwd, backward_weight=st.layers * layer.backward_weight)
        )
    state_bytes = profile.state_bytes or runtime_state_bytes(
        plan.train.precision, plan.train.optimizer, lay.zero, lay.dp, ddp_replicates(plan)
    )
    return CostContext(
        plan=plan,
        layout=lay,
        profile=profile,
        stages=stages,
        stage_style=stage_style,
        times=tuple(times),
        micro_batches=micro_batches(plan.train.global_batch, lay.dp, lay.micro_batch),
        tokens_per_microbatch=b * plan.model.seq_len,
        compute_bytes=e,
        residual_bytes=r,
        grad_reduce_bytes=int(state_bytes.grads) if profile.state_bytes else 4,
        state_bytes=state_bytes,
        device=cache.device,
        layer=layer,
        layer_act=layer_act,
        logits=logits,
        links=cache.links(lay, stage_style),
        capacity=plan.hardware.capacity,
        summary_seconds=cache.summary_seconds,
    )
