"""Plausible ranges of the hardware block's rates and sizes: a number far outside them is a typo
or a wrong unit, not a device.

The fields only require positive numbers; without a bound, ``inter_node_bw = 1e-300 GB/s``
priced steps of 10^300 seconds and ``memory = 1e30 GiB`` printed a 24-digit size. The bounds sit
far outside today's hardware on both sides, so that a faster device of the next decades is not
refused: memory 1 MiB .. 16 TiB per device (the largest accelerators hold 192-288 GiB, a CPU
process a host's few TiB), compute 1 GFLOPS .. 100 PFLOPS per device (a B200's dense bf16 peak is
2.25 PFLOPS, a CPU process's about 0.1 TFLOPS), and every bandwidth 1 MB/s .. 100 TB/s per
device (HBM3e 8 TB/s, NVLink 5 900 GB/s per direction, a 400 Gb/s NIC 50 GB/s; 1 MB/s is a slow
WAN link).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from planc.spec.issues import SpecIssue
from planc.spec.plan import Plan
from planc.units import format_bandwidth, format_bytes, format_compute


class Bound(NamedTuple):
    """The range one hardware key may take, as the .plan language writes it, and what it is per."""

    key: str
    low: float
    high: float
    range_text: str
    show: Callable[[float], str]
    per: str


TiB, MB, TB = 2**40, 1e6, 1e12
_BANDWIDTH = "1 MB/s .. 100 TB/s"

BOUNDS: tuple[Bound, ...] = (
    Bound("memory", 2**20, 16 * TiB, "1 MiB .. 16 TiB", format_bytes, "per device"),
    Bound("peak", 1e9, 1e17, "1 GFLOPS .. 100 PFLOPS", format_compute, "per device"),
    # Below peak's floor: a custom device's fp32 peak defaults to peak / 16.
    Bound("peak_fp32", 1e8, 1e17, "0.1 GFLOPS .. 100 PFLOPS", format_compute, "per device"),
    Bound("hbm_bw", MB, 100 * TB, _BANDWIDTH, format_bandwidth, "per device"),
    Bound("intra_node_bw", MB, 100 * TB, _BANDWIDTH, format_bandwidth, "per device and link"),
    Bound("inter_node_bw", MB, 100 * TB, _BANDWIDTH, format_bandwidth, "per device and link"),
    Bound("nvls_all_reduce_bw", MB, 100 * TB, _BANDWIDTH, format_bandwidth, "of the all-reduced buffer"),
)

#: What each key is compared with, for the hint.
_TODAY = {
    "memory": "the largest accelerators hold 192-288 GiB, a CPU process a host's few TiB",
    "peak": "a B200's dense bf16 peak is 2,250 TFLOPS, a CPU process's about 0.1 TFLOPS",
    "peak_fp32": "an H100's fp32 peak is 67 TFLOPS, a CPU process's about 0.1 TFLOPS",
    "hbm_bw": "HBM3e moves 8 TB/s, a CPU socket's DDR5 about 0.3 TB/s",
    "intra_node_bw": "NVLink 5 moves 900 GB/s per direction, PCIe 4 x16 32 GB/s",
    "inter_node_bw": "a 400 Gb/s NIC moves 50 GB/s, 10 Gb Ethernet 1.25 GB/s; "
    "inter_node_bw_per_node is shared by the node's per_node devices",
    "nvls_all_reduce_bw": "an H100 node's NVSwitch all-reduces 275 GB/s of buffer on 8 GPUs",
}


def check_hardware_ranges(plan: Plan) -> Iterable[SpecIssue]:
    """One issue per hardware key outside its plausible range (:data:`BOUNDS`)."""
    hw = plan.hardware
    refused: set[str] = set()
    for bound in BOUNDS:
        value = getattr(hw, bound.key)
        if value is None:  # an optional rate not given (a switch that cannot reduce)
            continue
        if bound.low <= value <= bound.high or (bound.key == "peak_fp32" and "peak" in refused):
            continue  # (an absurd peak makes its derived fp32 peak absurd too: one error is enough)
        refused.add(bound.key)
        key, shown = bound.key, bound.show(value)
        side = "below" if value < bound.low else "above"
        yield SpecIssue(
            ("hardware", key),
            f"{key} is {shown}, {side} the plausible range {bound.range_text} {bound.per}",
            f"check the number and its unit ({_TODAY[bound.key]})",
        )
