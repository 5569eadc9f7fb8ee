"""Placing process groups on the device graph: hand-derived cases."""

from planc.hardware import FABRIC, group_ranks, topology_for
from planc.spec import ParallelDims, build_plan
from planc.units import Quantity

# What NCCL moves of an A100 node's line rates (planc.spec.presets.hardware, sources there):
# 77% of NVLink3's 300 GB/s per direction (nccl-tests#149), 96% of a 25 GB/s HDR NIC (nccl#412).
NVLINK = 300e9 * 0.77
NIC = 25e9 * 0.96


def hardware(nodes=4, per_node=8):
    return build_plan(
        {
            "model": {"preset": "gpt2"},
            "hardware": {"device": "A100-80GB", "nodes": nodes, "per_node": per_node},
            "train": {"global_batch": 64},
        }
    ).hardware


def test_graph_shape():
    topo = topology_for(hardware())
    g = topo.graph
    # 32 devices + 4 switches + the fabric; each device: one NVLink edge, one NIC edge
    assert g.number_of_nodes() == 32 + 4 + 1
    assert g.number_of_edges() == 64
    assert g.edges[9, ("nvswitch", 1)]["bandwidth"] == NVLINK
    assert g.edges[9, FABRIC]["bandwidth"] == NIC


def test_group_ranks_follow_mesh_order():
    dims = ParallelDims(tp=2, pp=2, dp=8, world_size=32)
    # rank = (pp * dp + dp_rank) * tp + tp_rank
    assert group_ranks("tp", dims, 5) == [4, 5]
    assert group_ranks("dp", dims, 0) == [0, 2, 4, 6, 8, 10, 12, 14]
    assert group_ranks("pp", dims, 3) == [3, 19]


def test_tp_inside_a_node_dp_across():
    topo = topology_for(hardware())
    dims = ParallelDims(tp=8, pp=1, dp=4, world_size=32)
    tp, dp = topo.group("tp", dims), topo.group("dp", dims)
    assert (tp.bandwidth, tp.nodes, tp.medium) == (NVLINK, 1, "nvlink")
    # one member per node: a single NIC per node cut -> 24 GB/s, network latency
    assert (dp.bandwidth, dp.nodes, dp.per_node, dp.medium) == (NIC, 4, 1, "network")
    assert dp.latency == topo.hardware.inter_node_latency


def test_nics_add_up_when_a_group_has_several_members_per_node():
    topo = topology_for(hardware())
    dims = ParallelDims(tp=2, pp=1, dp=16, world_size=32)
    dp = topo.group("dp", dims)
    # 4 members per node: 4 x 25 = 100 GB/s across nodes, below NVLink's 300
    assert (dp.per_node, dp.bandwidth) == (4, 4 * NIC)
    dims = ParallelDims(tp=1, pp=1, dp=32, world_size=32)
    # 8 per node: min(300 NVLink, 8 x 25 = 200) = 200 GB/s
    assert topo.group("dp", dims).bandwidth == 8 * NIC


def test_single_node_dp_uses_nvlink_and_pipeline_neighbours():
    topo = topology_for(hardware(nodes=1))
    dims = ParallelDims(tp=1, pp=2, dp=4, world_size=8)
    assert topo.group("dp", dims).medium == "nvlink"
    assert topo.pipeline_p2p(dims).bandwidth == NVLINK  # ranks 0 and 4 share the node
    topo4 = topology_for(hardware(nodes=4))
    dims = ParallelDims(tp=8, pp=4, dp=1, world_size=32)
    assert topo4.pipeline_p2p(dims).bandwidth == NIC  # rank 0 -> rank 8: next node


def test_topology_is_cached_per_hardware():
    assert topology_for(hardware()) is topology_for(hardware())


def test_each_pipeline_boundary_is_its_own_link():
    # 2 nodes x 8, tp 2 x dp 2 = 4 ranks per stage: stage s holds ranks 4s .. 4s + 3, so stages 0-1
    # sit on node 0 (ranks 0-7) and 2-3 on node 1 (8-15). Only the boundary 1 -> 2 crosses nodes.
    topo = topology_for(hardware(nodes=2))
    dims = ParallelDims(tp=2, pp=4, dp=2, world_size=16)
    assert [hop.medium for hop in topo.pipeline_hops(dims)] == ["nvlink", "network", "nvlink"]
    slowest = topo.pipeline_p2p(dims)
    assert (slowest.medium, slowest.bandwidth) == ("network", NIC)  # one A100 NIC each side


def test_a_boundary_crosses_nodes_if_any_of_its_pairs_does():
    # 2 nodes x 6, tp 1, dp 4, pp 3: stages hold ranks 0-3, 4-7, 8-11; node 0 is ranks 0-5.
    # Boundary 0 -> 1 pairs (0,4) (1,5) inside node 0 but (2,6) (3,7) across; 1 -> 2 pairs (4,8) ...
    # all across. The first pair alone (0 -> 4) would call the first boundary NVLink.
    topo = topology_for(hardware(nodes=2, per_node=6))
    dims = ParallelDims(tp=1, pp=3, dp=4, world_size=12)
    assert [hop.medium for hop in topo.pipeline_hops(dims)] == ["network", "network"]


def test_interleaved_stages_wrap_and_zbv_turns_on_its_rank():
    # 2 nodes x 8, tp 4, pp 4: pipeline rank r holds ranks 4r .. 4r + 3, ranks 0-1 on node 0 and
    # 2-3 on node 1. Interleaved (v = 2, looped) runs stages 0..7 on ranks 0 1 2 3 0 1 2 3: the hop
    # 3 -> 0 between rounds crosses back. ZB-V runs them on 0 1 2 3 3 2 1 0: the turn 3 -> 3 is local.
    topo = topology_for(hardware(nodes=2))
    dims = ParallelDims(tp=4, pp=4, dp=1, world_size=16)
    n, w, local = "nvlink", "network", "local"
    assert [hop.medium for hop in topo.pipeline_hops(dims, 2)] == [n, w, n, w, n, w, n]
    assert [hop.medium for hop in topo.pipeline_hops(dims, 2, "v")] == [n, w, n, local, n, w, n]
    assert topo.pipeline_p2p(dims, 2, "v").medium == "network"


def test_a_group_whose_nics_outrun_its_nvlink_is_capped():
    topo = topology_for(hardware(nodes=2))
    # dp 16 over 2 nodes: 8 x 24 = 192 GB/s of NICs per node, under NVLink's 231: NIC-bound
    dp = topo.group("dp", ParallelDims(tp=1, pp=1, dp=16, world_size=16))
    assert (dp.bandwidth, dp.capped) == (8 * NIC, False)
    fast = build_plan(
        {
            "model": {"preset": "gpt2"},
            "hardware": {"device": "A100-80GB", "nodes": 2, "inter_node_bw": Quantity.of(100, "GB/s")},
            "train": {"global_batch": 64},
        }
    ).hardware
    # 8 x 96 = 768 GB/s of NICs per node, but each ring hop inside a node runs at NVLink's 231
    dp = topology_for(fast).group("dp", ParallelDims(tp=1, pp=1, dp=16, world_size=16))
    assert (dp.bandwidth, dp.capped) == (NVLINK, True)


def _hardware_of(device: str, **written):
    return build_plan(
        {"model": {"preset": "gpt2"}, "hardware": {"device": device, **written}, "train": {"global_batch": 64}}
    ).hardware


def test_links_are_priced_at_what_nccl_moves_of_their_line_rate():
    # H100: NCCL reaches 370 of NVLink4's 450 GB/s (nccl-tests#212) and 48 of a 50 GB/s NDR NIC
    h100 = topology_for(_hardware_of("H100-SXM", nodes=2))
    assert h100.group("tp", ParallelDims(tp=8, pp=1, dp=2, world_size=16)).bandwidth == 450e9 * 0.82
    assert h100.p2p(0, 8).bandwidth == 50e9 * 0.96
    # gloo between CPU processes: the preset's rates are rough figures of what moves, taken whole
    cpu = _hardware_of("cpu")
    assert (cpu.intra_node_link_efficiency, cpu.inter_node_link_efficiency) == (1.0, 1.0)
    # a device no preset describes takes NVLink's per-link share (20 of 25 GB/s) and InfiniBand's
    custom = _hardware_of(
        "X1",
        memory=Quantity.of(64, "GiB"),
        peak=Quantity.of(500, "TFLOPS"),
        intra_node_bw=Quantity.of(200, "GB/s"),
        inter_node_bw=Quantity.of(25, "GB/s"),
    )
    assert (custom.intra_node_link_efficiency, custom.inter_node_link_efficiency) == (0.8, 0.96)
    # a plan that knows its cluster better writes the share itself
    assert _hardware_of("H100-SXM", intra_node_link_efficiency=0.9).intra_node_link_efficiency == 0.9


def test_only_an_nvswitch_that_reduces_gets_the_switch_all_reduce():
    dims = ParallelDims(tp=8, pp=1, dp=2, world_size=16)
    h100 = topology_for(_hardware_of("H100-SXM", nodes=2))
    assert h100.group("tp", dims).switch_all_reduce_bw == 275e9  # inside a node
    assert h100.group("dp", dims).switch_all_reduce_bw == 0.0  # across nodes: the NICs carry it
    a100 = topology_for(_hardware_of("A100-80GB"))
    assert a100.group("tp", ParallelDims(tp=8, pp=1, dp=1, world_size=8)).switch_all_reduce_bw == 0.0
    # an H100 plan that writes a PCIe card's link has no NVSwitch to reduce in
    pcie = _hardware_of("H100-SXM", intra_node_bw=Quantity.of(64, "GB/s"))
    assert (pcie.intra_node_link, pcie.nvls_all_reduce_bw) == ("intra-node", None)
