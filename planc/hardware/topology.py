"""The cluster as a networkx graph, and the bandwidth a process group gets on it.

Graph
-----
Vertices are the devices (global ranks ``0 .. nodes*per_node-1``, attribute ``node``), one
NVSwitch vertex per node (``("nvswitch", n)``) and one vertex for the network fabric
(:data:`FABRIC`). Every device has two edges:

- to its node's switch: ``kind="nvlink"``, ``bandwidth = intra_node_bw x
  intra_node_link_efficiency`` (per device, one direction: what NCCL moves of the line rate),
  ``latency = intra_node_latency``;
- to the fabric, through its own NIC: ``kind="network"``, ``bandwidth = inter_node_bw x
  inter_node_link_efficiency``, ``latency = inter_node_latency``.

This is the DGX shape (NVSwitch inside a node, one NIC per GPU, a non-blocking fat tree between
nodes — Narayanan et al. 2021, Sec. 5; NVIDIA DGX A100/H100 user guides). The fabric vertex
stands for a full-bisection network: the per-device NIC is the bottleneck, not the core.

Placing a group
---------------
Which ranks form a group follows from the mesh order of :class:`~planc.spec.ParallelDims`
(rank = (pp_rank * dp + dp_rank) * tp + tp_rank: tp innermost, then dp, then pp). A ring
collective over a group is limited by its slowest hop:

- members that share a node talk over NVLink: ``min`` of their NVLink edges;
- a group spanning several nodes crosses each node boundary through the NICs of *its own
  members in that node*: NCCL runs one ring (channel) per NIC, so the group's bandwidth across
  a node cut is the **sum** of those members' NIC edges (k members per node -> k x
  inter_node_bw, NCCL's "bus bandwidth" across nodes), and the slowest node bounds the ring.

The group's bandwidth is the minimum of the two; its per-message latency (alpha) is the
network's when it crosses nodes, NVLink's otherwise. Concurrent groups of the same kind use
disjoint devices and hence disjoint NICs, so they do not share this bandwidth.

Pipeline neighbours
-------------------
Each boundary between pipeline stages is a link of its own: with tp x dp ranks per stage, stage
boundaries fall inside a node or on a node's edge depending on the layout (2 nodes x 8, tp 2, dp 2,
pp 4: stages 0-1 on node 0, 2-3 on node 1, so only the boundary 1 -> 2 crosses the network).
:meth:`Topology.pipeline_hops` gives every hop a micro-batch crosses, the wrap from the last stage
back to the first of a looped (interleaved) placement included, and
:meth:`Topology.pipeline_p2p` the slowest of them.

Speed: a topology is built once per hardware description (cached), and a group's link once per
(kind, tp, dp, pp) — the planner never builds a graph per layout.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache

import networkx as nx

from planc.spec.hardware import HardwareSpec
from planc.spec.parallel_dims import ParallelDims
from planc.stages import StageStyle, rank_of_stage

#: The network fabric vertex (all NICs connect to it).
FABRIC = ("network",)

GROUP_KINDS = ("tp", "dp", "pp")


@dataclass(frozen=True)
class GroupLink:
    """Where a process group landed: its size and the bottleneck of the links it crosses."""

    size: int
    """Number of ranks in the group."""
    bandwidth: float
    """Bottleneck bandwidth per rank for a ring over the group, bytes/s (one direction)."""
    latency: float
    """Per-message start-up cost (alpha), seconds."""
    nodes: int
    """Number of nodes the group spans."""
    per_node: int
    """Members of the group in each node it spans."""
    capped: bool = False
    """Across nodes with several members per node: the ring's hops inside a node (their NVLink or
    other intra-node link) bound it, not the members' NICs, whose sum per node would carry more."""
    switch_all_reduce_bw: float = 0.0
    """Inside one node whose switch reduces (NVLS): the all-reduce's algorithm bandwidth there,
    bytes of the buffer per second; 0 where the switch cannot (or a profile measured the link)."""
    kinds: tuple[tuple[str, float, float], ...] = ()
    """Per collective kind measured by ``planc calibrate`` on this medium, other than the one that
    set ``latency`` and ``bandwidth``: (kind, alpha, beta relative to that one's)."""

    def alpha_beta(self, kind: str) -> tuple[float, float]:
        """(alpha, beta) of a ``kind`` collective ("all_reduce", "all_gather", "reduce_scatter",
        "send_recv", "broadcast") over this group: the kind's own fit where the hardware profile has one (gloo
        on CPU: an all-gather's start-up 2x and a reduce-scatter's 4x an all-reduce's), else the
        link's. The relative beta keeps the topology's scaling (k NICs per node, the slowest hop)."""
        for name, alpha, relative_beta in self.kinds:
            if name == kind:
                return alpha, self.bandwidth * relative_beta
        return self.latency, self.bandwidth

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1

    @property
    def medium(self) -> str:
        """``"nvlink"`` inside a node, ``"network"`` across nodes, ``"local"`` for one rank."""
        if self.size == 1:
            return "local"
        return "network" if self.crosses_nodes else "nvlink"


#: A "link" that moves nothing over any wire: a pipeline hop that stays on its rank (ZB-V's turn), or
#: a pipeline of one stage.
LOCAL_LINK = GroupLink(size=1, bandwidth=float("inf"), latency=0.0, nodes=1, per_node=1)


def group_ranks(kind: str, dims: ParallelDims, rank: int = 0) -> list[int]:
    """The global ranks of the ``kind`` group ("tp", "dp" or "pp") that contains ``rank``.

    Follows the mesh order of :class:`ParallelDims`: tp innermost, then dp, then pp.
    """
    c = dims.coordinates(rank)
    if kind == "tp":
        return [(c["pp"] * dims.dp + c["dp"]) * dims.tp + t for t in range(dims.tp)]
    if kind == "dp":
        return [(c["pp"] * dims.dp + d) * dims.tp + c["tp"] for d in range(dims.dp)]
    if kind == "pp":
        return [(p * dims.dp + c["dp"]) * dims.tp + c["tp"] for p in range(dims.pp)]
    raise ValueError(f"unknown group kind {kind!r}; expected one of {GROUP_KINDS}")


class Topology:
    """The device graph of one hardware description, with cached group placements."""

    def __init__(self, hardware: HardwareSpec) -> None:
        self.hardware = hardware
        self.graph = _build_graph(hardware)
        self._links: dict[tuple, GroupLink] = {}
        self._hops: dict[tuple, tuple[GroupLink, ...]] = {}
        self._hop_counts: dict[tuple, tuple[tuple[GroupLink, int], ...]] = {}
        self._boundaries: dict[tuple[int, int, int], GroupLink] = {}

    @property
    def world_size(self) -> int:
        return self.hardware.world_size

    def link_of(self, ranks: list[int]) -> GroupLink:
        """Bottleneck bandwidth and latency of a ring collective over ``ranks``."""
        g = self.graph
        by_node: dict[int, list[int]] = defaultdict(list)
        for r in ranks:
            by_node[g.nodes[r]["node"]].append(r)
        hw = self.hardware
        if len(ranks) <= 1:
            return GroupLink(size=len(ranks), bandwidth=float("inf"), latency=0.0, nodes=1, per_node=1)
        limits: list[float] = []
        if any(len(members) > 1 for members in by_node.values()):
            # Hops inside a node: device -> NVSwitch -> device; the slowest member's link bounds it.
            limits.append(
                min(
                    g.edges[r, ("nvswitch", n)]["bandwidth"]
                    for n, members in by_node.items()
                    if len(members) > 1
                    for r in members
                )
            )
        crosses = len(by_node) > 1
        capped = False
        if crosses:
            # Across nodes: one ring per NIC, so a node's cut carries the sum of its members' NICs.
            cut = min(sum(g.edges[r, FABRIC]["bandwidth"] for r in members) for members in by_node.values())
            capped = bool(limits) and limits[0] < cut
            limits.append(cut)
        latency = hw.inter_node_latency if crosses else hw.intra_node_latency
        per_node = min(len(m) for m in by_node.values())
        kinds = _measured_kinds(hw, "inter_node" if crosses else "intra_node")
        return GroupLink(
            size=len(ranks),
            bandwidth=min(limits),
            latency=latency,
            nodes=len(by_node),
            per_node=per_node,
            capped=capped,
            switch_all_reduce_bw=0.0 if crosses or kinds else (hw.nvls_all_reduce_bw or 0.0),
            kinds=kinds,
        )

    def group(self, kind: str, dims: ParallelDims) -> GroupLink:
        """The link of the ``kind`` group of ``dims`` (all groups of a kind are congruent)."""
        key = (kind, dims.tp, dims.dp, dims.pp)
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = self.link_of(group_ranks(kind, dims))
        return link

    def world(self) -> GroupLink:
        """The link of a collective over every rank (memoised: the topology is shared by every
        plan on the same hardware)."""
        link = self._links.get(("world",))
        if link is None:
            link = self._links[("world",)] = self.link_of(list(range(self.world_size)))
        return link

    def p2p(self, a: int, b: int) -> GroupLink:
        """One device-to-device transfer: NVLink inside a node, the two NICs across nodes."""
        g = self.graph
        na, nb = g.nodes[a]["node"], g.nodes[b]["node"]
        if na == nb:
            bw = min(g.edges[a, ("nvswitch", na)]["bandwidth"], g.edges[b, ("nvswitch", nb)]["bandwidth"])
            kinds = _measured_kinds(self.hardware, "intra_node")
            return GroupLink(2, bw, self.hardware.intra_node_latency, nodes=1, per_node=2, kinds=kinds)
        bw = min(g.edges[a, FABRIC]["bandwidth"], g.edges[b, FABRIC]["bandwidth"])
        kinds = _measured_kinds(self.hardware, "inter_node")
        return GroupLink(2, bw, self.hardware.inter_node_latency, nodes=2, per_node=1, kinds=kinds)

    def pipeline_hops(self, dims: ParallelDims, v: int = 1, style: StageStyle = "looped") -> tuple[GroupLink, ...]:
        """The link of each hop a micro-batch's activation crosses on its way through the pipeline,
        stage j to stage j + 1 for j = 0 .. pp*v - 2 in order; its gradient comes back over the same
        hops. The stages sit on pipeline ranks by :func:`planc.stages.rank_of_stage`: a looped
        placement (interleaved, zero-bubble) wraps from the last rank back to the first between its
        v rounds; ZB-V's turn (stages pp - 1 and pp) stays on its rank, a local hop."""
        key = ("pp-hops", dims.tp, dims.dp, dims.pp, v, style)
        hops = self._hops.get(key)
        if hops is None:
            ranks = [rank_of_stage(j, dims.pp, v, style) for j in range(dims.pp * v)]
            hops = self._hops[key] = tuple(self._boundary(dims, a, b) for a, b in zip(ranks, ranks[1:]))
        return hops

    def pipeline_hop_counts(
        self, dims: ParallelDims, v: int = 1, style: StageStyle = "looped"
    ) -> tuple[tuple[GroupLink, int], ...]:
        """:meth:`pipeline_hops` as (link, how many hops have it), in first-seen order: a 64-stage
        pipeline crosses two or three kinds of link, and the planner prices each kind once."""
        key = (dims.tp, dims.dp, dims.pp, v, style)
        counts = self._hop_counts.get(key)
        if counts is None:
            tally: dict[GroupLink, int] = {}
            for hop in self.pipeline_hops(dims, v, style):
                tally[hop] = tally.get(hop, 0) + 1
            counts = self._hop_counts[key] = tuple(tally.items())
        return counts

    def pipeline_p2p(self, dims: ParallelDims, v: int = 1, style: StageStyle = "looped") -> GroupLink:
        """The slowest link between pipeline neighbours (:meth:`pipeline_hops`): each boundary is a
        link of its own, and the sends over the slowest one sit on the path of every micro-batch,
        so it sets the pace once its transfers outlast a stage's compute."""
        hops = self.pipeline_hops(dims, v, style)
        if not hops:
            return LOCAL_LINK
        return min(hops, key=lambda link: (link.bandwidth, -link.latency))

    def _boundary(self, dims: ParallelDims, a: int, b: int) -> GroupLink:
        """The link between pipeline ranks ``a`` and ``b``: the slowest of the dp x tp pairs that
        cross it at once (global ranks ``a * dp * tp + o`` and ``b * dp * tp + o``, mesh order), one
        per pipeline group. Every device has the same NVLink and NIC edges, so a pair's link depends
        only on whether it crosses nodes: one crossing pair puts the boundary on the network (with
        2 nodes x 8, tp 2, dp 2, pp 4: stage 1 holds ranks 4-7, stage 2 ranks 8-11, node 1)."""
        if a == b:
            return LOCAL_LINK
        group, node = dims.dp * dims.tp, self.graph.nodes
        key = (group, a, b)  # the planner meets the same boundary in many layouts
        found = self._boundaries.get(key)
        if found is None:
            pairs = ((a * group + o, b * group + o) for o in range(group))
            crossing = next(((x, y) for x, y in pairs if node[x]["node"] != node[y]["node"]), (a * group, b * group))
            found = self._boundaries[key] = self.p2p(*crossing)
        return found


def _measured_kinds(hw: HardwareSpec, medium: str) -> tuple[tuple[str, float, float], ...]:
    """:attr:`GroupLink.kinds` from a hardware profile's collective fits on ``medium``: each kind
    but the reference (the all-reduce, as :func:`~planc.spec.hardware_profile.hardware_values`
    chose for the link) with its alpha and its beta over the reference's. Empty without a profile,
    or when the plan wrote that medium's bandwidth or latency itself (its keys win)."""
    fits = [f for f in (hw.measured.collectives if hw.measured else ()) if f.medium == medium]
    if not fits:
        return ()
    reference = next((f for f in fits if f.kind == "all_reduce"), fits[0])
    if (getattr(hw, f"{medium}_bw"), getattr(hw, f"{medium}_latency")) != (reference.bandwidth, reference.latency):
        return ()
    return tuple((f.kind, f.latency, f.bandwidth / reference.bandwidth) for f in fits if f.kind != reference.kind)


def _build_graph(hw: HardwareSpec) -> nx.Graph:
    # Bulk construction with shared keyword attributes: ~50 ms for 16,384 devices.
    graph = nx.Graph()
    per_node, ranks = hw.per_node, range(hw.world_size)
    graph.add_nodes_from(ranks)
    nx.set_node_attributes(graph, {rank: rank // per_node for rank in ranks}, "node")
    graph.add_node(FABRIC, kind="fabric")
    graph.add_edges_from(
        ((rank, ("nvswitch", rank // per_node)) for rank in ranks),
        kind="nvlink",
        bandwidth=hw.intra_node_bw * hw.intra_node_link_efficiency,
        latency=hw.intra_node_latency,
    )
    graph.add_edges_from(
        ((rank, FABRIC) for rank in ranks),
        kind="network",
        bandwidth=hw.inter_node_bw * hw.inter_node_link_efficiency,
        latency=hw.inter_node_latency,
    )
    return graph


@lru_cache(maxsize=16)
def topology_for(hardware: HardwareSpec) -> Topology:
    """The (cached) topology of a hardware description."""
    return Topology(hardware)
