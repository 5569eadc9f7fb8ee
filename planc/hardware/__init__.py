"""The hardware as a graph of devices and links, and where process groups land on it.

``from planc.hardware import topology_for, GroupLink`` — see :mod:`planc.hardware.topology`.
"""

from planc.hardware.topology import (
    FABRIC,
    GroupLink,
    Topology,
    group_ranks,
    topology_for,
)

__all__ = ["FABRIC", "GroupLink", "Topology", "group_ranks", "topology_for"]
