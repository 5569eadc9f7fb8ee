"""The ``hardware`` block: which devices, how many, and how they are connected."""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, computed_field, model_validator

from planc.spec.fields import Bandwidth, Bytes, Compute, Flag, PositiveInt, Seconds, SpecModel
from planc.spec.hardware_profile import MeasuredRates
from planc.spec.presets.hardware import (
    DEFAULT_HEADROOM,
    DEFAULT_INTER_NODE_LATENCY,
    DEFAULT_INTER_NODE_LINK_EFFICIENCY,
    DEFAULT_INTRA_NODE_LATENCY,
    DEFAULT_INTRA_NODE_LINK_EFFICIENCY,
    HARDWARE_PRESETS,
    INTRA_NODE_LINK,
    UNNAMED_INTRA_NODE_LINK,
)

#: Keys a custom (non-preset) device must give itself.
CUSTOM_DEVICE_REQUIRED = ("memory", "peak", "intra_node_bw", "inter_node_bw")


class HardwareSpec(SpecModel):
    """The cluster: ``nodes`` machines of ``per_node`` identical devices (one process each)."""

    device: str
    """A preset (A100-80GB, H100-SXM, "cpu" for gloo, ...) or your own name given memory, peak, intra/inter_node_bw."""
    nodes: PositiveInt = 1
    """Number of machines."""
    per_node: PositiveInt
    """Devices (= processes) per machine (default: the preset's, 8 for GPU servers)."""
    memory: Bytes
    """Memory per device (default: the preset's), e.g. 80 GiB."""
    peak: Compute
    """Dense bf16 peak per device (default: the preset's), e.g. 312 TFLOPS."""
    peak_fp32: Compute
    """Dense fp32 peak per device, used by fp32 plans (default: the preset's)."""
    hbm_bw: Bandwidth
    """Device memory bandwidth (default: the preset's), e.g. 2039 GB/s."""
    intra_node_bw: Bandwidth
    """Bandwidth per device, one direction, between devices of one node (NVLink, Infinity Fabric, PCIe)."""
    intra_node_link: str = Field(min_length=1, max_length=40)
    """What links the devices of one node, as explain names it: NVLink, Infinity Fabric, PCIe, ..."""
    inter_node_bw: Bandwidth
    """Network bandwidth per device, one direction, between nodes (200 Gb/s IB = 25 GB/s)."""
    inter_node_bw_per_node: Bandwidth | None = None
    """The network per node instead (e.g. 8 x 400 Gb/s = 400 GB/s): planc divides it by per_node
    into inter_node_bw (give one of the two)."""
    intra_node_link_efficiency: float = Field(gt=0, le=1)
    """Fraction of intra_node_bw that NCCL's collectives move (bus bandwidth over line rate): 0.77 on
    A100's NVLink, 0.82 on H100's (sources in planc/spec/presets/hardware.py); 1 where a profile measured it."""
    inter_node_link_efficiency: float = Field(gt=0, le=1)
    """Fraction of inter_node_bw that NCCL's collectives move: 0.96 on InfiniBand; 1 where a profile measured it."""
    nvls_all_reduce_bw: Bandwidth | None = None
    """Algorithm bandwidth (buffer bytes per second) of an all-reduce inside a node that the NVSwitch
    reduces (NVLink SHARP: 275 GB/s on H100 and H200); none where the node's switch cannot reduce."""
    intra_node_latency: Seconds
    """Start-up cost (alpha) of one message inside a node."""
    inter_node_latency: Seconds
    """Start-up cost (alpha) of one message across nodes."""
    efficiency: float = Field(gt=0, le=1)
    """Fraction of peak the transformer's large GEMMs sustain (kernel efficiency, not MFU)."""
    headroom: float = Field(default=DEFAULT_HEADROOM, ge=0, lt=1)
    """Fraction of memory the planner keeps free: a layout must fit memory x (1 - headroom)."""
    bf16: Flag = True
    """Whether the device computes bf16 in hardware (false for V100: fp16 tensor cores only)."""
    profile: str | None = None
    """A hardware profile written by `planc calibrate` (JSON, relative to the .plan file): the cost
    model uses its measured rates instead of the data-sheet defaults; keys written here still win."""
    measured: MeasuredRates | None = None
    """What the profile measured (GEMM, attention, memory, dispatch rates); filled from ``profile``."""

    @model_validator(mode="before")
    @classmethod
    def _fill_from_preset(cls, data: Any) -> Any:
        """Take every key the plan leaves out from the device preset; plan keys win."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        data.pop("world_size", None)  # computed; present in plan.json
        device = data.get("device")
        preset = HARDWARE_PRESETS.get(device, {}) if isinstance(device, str) else {}
        _per_node_network(data, preset)
        data.setdefault("intra_node_link", _default_link(device, preset, data))
        # peak_fp32 follows a written peak only when that is a usable rate: from peak = 0 it would
        # be 0 too, and its error would name a key the plan never wrote (peak's own says it all).
        peak = _positive_number(data.get("peak"))
        if preset and "peak_fp32" not in data and peak:
            # A plan that overrides the bf16 peak but not fp32 keeps the preset's ratio.
            data["peak_fp32"] = preset["peak_fp32"] * peak / preset["peak"]
        if preset and data["intra_node_link"] != INTRA_NODE_LINK.get(device):
            # NVLS is the preset's NVSwitch reducing: a plan that made the node's link another
            # (a PCIe card's intra_node_bw) has no such switch.
            preset = {k: v for k, v in preset.items() if k != "nvls_all_reduce_bw"}
        for key, value in preset.items():
            data.setdefault(key, value)
        if not preset and peak:
            data.setdefault("peak_fp32", peak / 16)  # tensor-core vs fp32 ratio of A100
        data.setdefault("per_node", 8)
        data.setdefault("intra_node_latency", DEFAULT_INTRA_NODE_LATENCY)
        data.setdefault("inter_node_latency", DEFAULT_INTER_NODE_LATENCY)
        data.setdefault("hbm_bw", 2000e9)
        data.setdefault("efficiency", 0.7)
        data.setdefault("intra_node_link_efficiency", DEFAULT_INTRA_NODE_LINK_EFFICIENCY)
        data.setdefault("inter_node_link_efficiency", DEFAULT_INTER_NODE_LINK_EFFICIENCY)
        return data

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form
    @property
    def world_size(self) -> int:
        """Total devices = processes: nodes x per_node."""
        return self.nodes * self.per_node

    @property
    def is_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def intra_node_link_named(self) -> bool:
        """Whether anything names the node's link (else explain calls it "intra-node")."""
        return self.intra_node_link != UNNAMED_INTRA_NODE_LINK

    @property
    def capacity(self) -> float:
        """The bytes a layout may use per device: memory less the headroom."""
        return self.memory * (1.0 - self.headroom)


def _default_link(device: Any, preset: dict, data: dict) -> str:
    """``intra_node_link`` when the plan does not write it. The preset's medium describes the
    preset's ``intra_node_bw`` only: an A100-80GB written with ``intra_node_bw = 32 GB/s`` is a
    PCIe card, not NVLink (a profile's measured rate is the preset's own link, so it keeps the
    name). Else a device whose name says PCIe ("L40S-PCIe") is PCIe; else the link has no name."""
    medium = INTRA_NODE_LINK.get(device) if isinstance(device, str) else None
    written = data.get("intra_node_bw")
    if medium and (written is None or data.get("profile") or _positive_number(written) == preset["intra_node_bw"]):
        return medium
    if isinstance(device, str) and "pcie" in device.lower():
        return "PCIe"
    return UNNAMED_INTRA_NODE_LINK


def _per_node_network(data: dict, preset: dict) -> None:
    """``inter_node_bw_per_node`` -> ``inter_node_bw`` (per device), in place."""
    per_node_bw = data.get("inter_node_bw_per_node")
    if per_node_bw is None:
        return
    if data.get("inter_node_bw") is not None:
        raise ValueError("give inter_node_bw (per device) or inter_node_bw_per_node (per node), not both")
    per_node = data.get("per_node", preset.get("per_node", 8))
    kind = getattr(per_node_bw, "kind", "bandwidth")
    if isinstance(per_node, int) and per_node > 0 and kind == "bandwidth" and not isinstance(per_node_bw, str):
        # A wrong kind or type is left to the field's own validator, which says so. The per-node
        # figure is consumed, so plan.json holds the per-device one alone and reads back the same.
        data["inter_node_bw"] = _as_number(per_node_bw) / per_node
        data["inter_node_bw_per_node"] = None


def _as_number(value: Any) -> float:
    return float(getattr(value, "value", value))


def _positive_number(value: Any) -> float | None:
    """A quantity's or number's value when it is a positive finite number, else None (the key's
    own validation reports what is wrong with it)."""
    try:
        number = _as_number(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None
