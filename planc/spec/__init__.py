"""The validated plan: typed, frozen pydantic models of every ``.plan`` block.

Import from here: ``from planc.spec import Plan, build_plan, Layout, ParallelDims``.
"""

from planc.spec.build import BLOCKS, block_keys, build_plan
from planc.spec.checkpoint import CheckpointSpec
from planc.spec.hardware import HardwareSpec
from planc.spec.issues import SpecError, SpecIssue
from planc.spec.layout import Layout, LayoutSpec
from planc.spec.model import ModelSpec
from planc.spec.parallel_dims import MESH_DIM_NAMES, ParallelDims
from planc.spec.plan import Plan, PluginUse
from planc.spec.train import TrainSpec

__all__ = [
    "BLOCKS",
    "block_keys",
    "build_plan",
    "CheckpointSpec",
    "HardwareSpec",
    "SpecError",
    "SpecIssue",
    "Layout",
    "LayoutSpec",
    "ModelSpec",
    "MESH_DIM_NAMES",
    "ParallelDims",
    "Plan",
    "PluginUse",
    "TrainSpec",
]
