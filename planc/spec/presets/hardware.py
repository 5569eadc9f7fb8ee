"""Device presets: memory, peak compute and link bandwidths, from vendors' data sheets.

Conventions (the cost model relies on them):

- ``memory`` is what the driver reports to programs (``nvidia-smi``'s memory.total, which
  ``torch.cuda.mem_get_info`` also returns; ``rocm-smi``'s VRAM total on AMD), not the marketing
  figure: an "80 GB" H100 shows 81559 MiB = 79.6 GiB, an A100-80GB 81920 MiB = 80 GiB (the
  driver keeps part of the HBM for itself on Hopper and later). :data:`NOMINAL_MEMORY` keeps
  the data sheet's figure. Sources, as printed by the tools on the named part (nvidia-smi
  outputs quoted in public logs; the same figures appear in every driver from 525 to 570):

  ========== ============================== ==================
  preset     reported total                 nominal
  ========== ============================== ==================
  V100-32GB  32768 MiB (Tesla V100-SXM2-32GB)  32 GB
  A100-40GB  40960 MiB (A100-SXM4-40GB)      40 GB
  A100-80GB  81920 MiB (A100-SXM4-80GB)      80 GB
  H100-SXM   81559 MiB (H100 80GB HBM3)       80 GB
  H200       143771 MiB (H200)               141 GB
  B200       183359 MiB (B200)               180 GB (192 GB HBM3e)
  MI300X     205822885888 B (rocm-smi)        192 GB
  ========== ============================== ==================
- the planner keeps ``headroom`` (default :data:`DEFAULT_HEADROOM`) of it free; see
  docs/planner.md, "Headroom".
- ``peak`` is the *dense* (no 2:4 sparsity) bf16 tensor-core rate per device; ``peak_fp32`` is the
  plain fp32 rate that ``torch.matmul`` gets with TF32 off (PyTorch's default for matmul).
- ``intra_node_bw`` is NVLink (or Infinity Fabric) bandwidth per device *in one direction*:
  vendors quote bidirectional totals, so 600 GB/s NVLink3 is 300 GB/s here.
- ``inter_node_bw`` is the network injection bandwidth per device, one direction: a DGX A100 has
  one 200 Gb/s HDR InfiniBand port per GPU = 25 GB/s.
- ``efficiency`` is the fraction of ``peak`` that large, well-shaped bf16 GEMMs *sustain* under
  full load (kernel efficiency, not MFU: shapes, attention, elementwise traffic, communication
  and bubbles are modelled separately by planc.cost). Source: Bekman, "Machine Learning
  Engineering", compute/accelerator (github.com/stas00/ml-engineering), which measures the
  Maximum Achievable Matmul FLOPS (MAMF, a boost-clock burst) and the Maximum Sustainable
  Matmul FLOPS (MSMF, power-saturated, "matches real training throughput") with mamf-finder.py:

  ========= ============ ============ ====================================================
  device    MAMF / peak  MSMF / peak  efficiency used
  ========= ============ ============ ====================================================
  A100 SXM  267.9 / 312  --           0.73 = 0.859 x 0.849 (H200's MSMF/MAMF ratio)
  H100 SXM  792.1 / 989  --           0.68 = 0.801 x 0.849
  H200      828.0 / 989  702.9 / 989  0.71 (MSMF)
  B200      1732.6/2250  1455.7/2250  0.65 (MSMF)
  MI300X    781.9 / 1307 --           0.60 (MAMF; the card runs at its power cap from the
                                      first kernel, so there is no burst to discount)
  V100      --           --           0.73, assumed equal to A100 (no published measurement)
  ========= ============ ============ ====================================================
- ``intra_node_link_efficiency`` and ``inter_node_link_efficiency`` are the fractions of those
  line rates that NCCL's collectives move (bus bandwidth over line rate, large messages): every
  NVLink or NIC packet carries headers, and NCCL's kernels send 128-byte payloads. Sources are
  NCCL's developers at NVIDIA (GitHub handles) answering users' nccl-tests results. The cost model
  prices links at ``bw x efficiency``; a ``planc calibrate`` profile's measured rates are already
  what NCCL moves and set both to 1:

  ============ ========= ==================================================================
  link         share     source
  ============ ========= ==================================================================
  NVLink3 A100 0.77      230 of 300 GB/s: each 25 GB/s link moves ~20 GB/s with 128-byte
                         payloads, 240 GB/s, and "other bottlenecks on the GPUs" limit it to
                         ~230 (@sjeaugey, NVIDIA/nccl-tests#149, 2023-07-05)
  NVLink4 H100 0.82      370 of 450 GB/s: "with the protocol overhead (~20%) NCCL can get an
                         effective NVLink bandwidth of 370GB/s" (@sjeaugey,
                         NVIDIA/nccl-tests#212, 2024-05-06); H200 has the same NVLink4
  other NVLink 0.80      the per-link figure above, 20 of 25 GB/s (V100's NVLink2, B200's
                         NVLink5: no NCCL figure found for either); MI300X's Infinity Fabric
                         under RCCL: no figure found, the same share assumed
  InfiniBand   0.96      24 of 25 GB/s per HDR NIC (@sjeaugey, NVIDIA/nccl#412, 2023-04-24);
                         192 of 200 GB/s all-reduce bus bandwidth on a DGX A100's 8 HDR NICs
                         (@AddyLaddy, NVIDIA/nccl#812); 48-49 of 50 GB/s per NDR ConnectX-7
                         (@AddyLaddy, NVIDIA/nccl-tests#267, 2024-11-19)
  ============ ========= ==================================================================
- ``nvls_all_reduce_bw``: on H100 and H200 NVSwitch nodes NCCL (2.17 and later) runs an all-reduce
  inside the node as NVLink SHARP (NVLS): the switch adds, each GPU sends its buffer once and
  receives the sum once, at an algorithm bandwidth (buffer bytes per second) of ~275 GB/s on 8
  GPUs, bus bandwidth ~480 GB/s (@sjeaugey, NVIDIA/nccl-tests#212). Unlike a ring's, that rate
  does not fall with the group's size; :func:`planc.cost.comm.all_reduce_seconds` takes the faster
  of it and the ring (on 2 GPUs the ring is faster). A100 switches cannot reduce (nccl-tests#228:
  "NVLS was a new feature of H100"); B200's NVLS has no figure here and is not modelled.
- Latencies are the per-message start-up cost (alpha) of NCCL within a node (NVLink) and across
  nodes (InfiniBand/RoCE), order-of-magnitude figures from NCCL's tuning model.
"""

from __future__ import annotations

GiB = 2**30
MiB = 2**20
GB = 10**9

#: Fraction of the device's memory the planner keeps free by default (``hardware.headroom``).
#: The cost model already adds its allocator margin (5 %) and a fixed 1 GiB for the CUDA context;
#: the headroom is for what it does not model and has not been checked against on a GPU:
#: NCCL buffers that grow with the communicators a layout opens, per-stream cuBLAS workspaces, the
#: optimizer step's temporaries, fragmentation spikes. 5 % is 4 GiB on an 80 GB part.
DEFAULT_HEADROOM = 0.05
TFLOPS = 1e12

HARDWARE_PRESETS: dict[str, dict] = {
    # NVIDIA V100 SXM2 32GB data sheet (2020): 125 TFLOPS fp16 tensor (no bf16 in hardware:
    # planc uses the fp16 rate for bf16 plans), 15.7 TFLOPS fp32, 900 GB/s HBM2, NVLink2 300 GB/s
    # total. DGX-1V: 4 x 100 Gb/s EDR IB for 8 GPUs = 6.25 GB/s per GPU.
    "V100-32GB": dict(
        memory=32768 * MiB,
        peak=125 * TFLOPS,
        peak_fp32=15.7 * TFLOPS,
        hbm_bw=900 * GB,
        intra_node_bw=150 * GB,
        inter_node_bw=6.25 * GB,
        per_node=8,
        efficiency=0.73,
        intra_node_link_efficiency=0.8,
        inter_node_link_efficiency=0.96,
        bf16=False,  # Volta tensor cores take fp16 only (bf16 came with Ampere: A100 whitepaper, 2020)
    ),
    # NVIDIA A100 Tensor Core GPU data sheet (2021): 312 TFLOPS bf16 dense, 19.5 TFLOPS fp32,
    # 40GB: 1,555 GB/s; 80GB: 2,039 GB/s; NVLink3 600 GB/s total. DGX A100: 8 x 200 Gb/s HDR IB.
    "A100-40GB": dict(
        memory=40960 * MiB,
        peak=312 * TFLOPS,
        peak_fp32=19.5 * TFLOPS,
        hbm_bw=1555 * GB,
        intra_node_bw=300 * GB,
        inter_node_bw=25 * GB,
        per_node=8,
        efficiency=0.73,
        intra_node_link_efficiency=0.77,
        inter_node_link_efficiency=0.96,
    ),
    "A100-80GB": dict(
        memory=81920 * MiB,
        peak=312 * TFLOPS,
        peak_fp32=19.5 * TFLOPS,
        hbm_bw=2039 * GB,
        intra_node_bw=300 * GB,
        inter_node_bw=25 * GB,
        per_node=8,
        efficiency=0.73,
        intra_node_link_efficiency=0.77,
        inter_node_link_efficiency=0.96,
    ),
    # NVIDIA H100 Tensor Core GPU data sheet (SXM5): 989 TFLOPS bf16 dense (1,979 with sparsity),
    # 67 TFLOPS fp32, 3.35 TB/s HBM3, NVLink4 900 GB/s total. DGX H100: 8 x 400 Gb/s ConnectX-7.
    "H100-SXM": dict(
        memory=81559 * MiB,
        peak=989 * TFLOPS,
        peak_fp32=67 * TFLOPS,
        hbm_bw=3350 * GB,
        intra_node_bw=450 * GB,
        inter_node_bw=50 * GB,
        per_node=8,
        efficiency=0.68,
        intra_node_link_efficiency=0.82,
        inter_node_link_efficiency=0.96,
        nvls_all_reduce_bw=275 * GB,
    ),
    # NVIDIA H200 data sheet (SXM): same compute as H100, 141 GB HBM3e at 4.8 TB/s;
    # nvidia-smi reports 143771 MiB = 140.4 GiB.
    "H200": dict(
        memory=143771 * MiB,
        peak=989 * TFLOPS,
        peak_fp32=67 * TFLOPS,
        hbm_bw=4800 * GB,
        intra_node_bw=450 * GB,
        inter_node_bw=50 * GB,
        per_node=8,
        efficiency=0.71,
        intra_node_link_efficiency=0.82,
        inter_node_link_efficiency=0.96,
        nvls_all_reduce_bw=275 * GB,
    ),
    # NVIDIA DGX B200 data sheet: 1,440 GB for 8 GPUs (180 GB each), 72 PFLOPS fp8 training
    # (dense) for 8 -> 2.25 PFLOPS bf16 dense per GPU; HBM3e 8 TB/s; NVLink5 1.8 TB/s total;
    # 8 x 400 Gb/s ConnectX-7.
    "B200": dict(
        memory=183359 * MiB,
        peak=2250 * TFLOPS,
        peak_fp32=75 * TFLOPS,
        hbm_bw=8000 * GB,
        intra_node_bw=900 * GB,
        inter_node_bw=50 * GB,
        per_node=8,
        efficiency=0.65,
        intra_node_link_efficiency=0.8,
        inter_node_link_efficiency=0.96,
    ),
    # AMD Instinct MI300X data sheet: 192 GB HBM3 at 5.3 TB/s, 1,307.4 TFLOPS bf16 dense,
    # 163.4 TFLOPS fp32 matrix; 7 Infinity Fabric links of 128 GB/s (bidirectional) each
    # -> 448 GB/s one direction; one 400 Gb/s NIC per GPU.
    "MI300X": dict(
        memory=205822885888,
        peak=1307.4 * TFLOPS,
        peak_fp32=163.4 * TFLOPS,
        hbm_bw=5300 * GB,
        intra_node_bw=448 * GB,
        inter_node_bw=50 * GB,
        per_node=8,
        efficiency=0.60,
        intra_node_link_efficiency=0.8,
        inter_node_link_efficiency=0.96,
    ),
    # CPU processes over gloo, for laptop runs and tests. Rough, modest figures: a few cores'
    # worth of fp32 GEMM per process and loopback TCP between processes. Nobody plans a real
    # run on these numbers; they keep `planc explain` meaningful for CPU plans.
    "cpu": dict(
        memory=4 * GiB,
        peak=0.1 * TFLOPS,
        peak_fp32=0.1 * TFLOPS,
        hbm_bw=20 * GB,
        intra_node_bw=2 * GB,
        inter_node_bw=1 * GB,
        per_node=4,
        efficiency=0.5,
        intra_node_link_efficiency=1.0,
        inter_node_link_efficiency=1.0,
        intra_node_latency=20e-6,
        inter_node_latency=50e-6,
    ),
}

#: The data sheets' memory per device, in bytes (what explain and the preset table call nominal).
NOMINAL_MEMORY: dict[str, float] = {
    "V100-32GB": 32 * GB,
    "A100-40GB": 40 * GB,
    "A100-80GB": 80 * GB,
    "H100-SXM": 80 * GB,
    "H200": 141 * GB,
    "B200": 180 * GB,
    "MI300X": 192 * GB,
}

#: The link between the devices of one node, by preset: what explain calls ``intra_node_bw``'s
#: medium (``hardware.intra_node_link``'s default). It names the preset's own link only: a plan
#: that writes another ``intra_node_bw`` for the device, or a custom device, is called "PCIe" when
#: the device's name says so and else :data:`UNNAMED_INTRA_NODE_LINK` (so is "cpu", gloo over
#: loopback): planc does not know whether it is NVLink, PCIe or something else.
INTRA_NODE_LINK: dict[str, str] = {
    "V100-32GB": "NVLink",
    "A100-40GB": "NVLink",
    "A100-80GB": "NVLink",
    "H100-SXM": "NVLink",
    "H200": "NVLink",
    "B200": "NVLink",
    "MI300X": "Infinity Fabric",
}

#: What explain calls a node's link when nothing names it.
UNNAMED_INTRA_NODE_LINK = "intra-node"

#: NCCL-like message start-up costs (alpha), used when a preset does not set its own.
DEFAULT_INTRA_NODE_LATENCY = 5e-6
DEFAULT_INTER_NODE_LATENCY = 10e-6

#: The link shares NCCL reaches on a device no preset describes: NVLink's per-link protocol figure
#: and InfiniBand's (see the module's docstring for both sources).
DEFAULT_INTRA_NODE_LINK_EFFICIENCY = 0.80
DEFAULT_INTER_NODE_LINK_EFFICIENCY = 0.96
