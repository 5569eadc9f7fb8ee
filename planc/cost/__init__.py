"""planc's analytical cost model: memory per device, time per step, for any layout.

Pure functions with cited formulas (see docs/cost-model.md):

- :mod:`planc.cost.params`   parameters per pipeline stage and TP shard
- :mod:`planc.cost.memory`   model states (ZeRO), activations (Korthikanti), buffers
- :mod:`planc.cost.flops`    FLOPs per step (Narayanan Eq. 3)
- :mod:`planc.cost.compute`  kernel times (roofline, wave quantization)
- :mod:`planc.cost.comm`     alpha-beta collectives
- :mod:`planc.cost.data_parallel`  what the data-parallel passes share
- :mod:`planc.cost.driver`    base terms -> passes -> fixed overheads

Entry point: ``evaluate(plan, layout, passes) -> Estimate``, the passes being the active
strategies' (``registry.passes(plan, layout)``): the cost model never looks strategies up.
"""

from planc.cost.context import ContextCache, CostContext, build_context
from planc.cost.driver import base_estimate, evaluate, finalize, run_passes
from planc.cost.estimate import CommCost, CostPass, Estimate, Passes, StageMemory, Term
from planc.cost.profile import MEGATRON_LM_2021, PLANC_RUNTIME, PROFILES, RuntimeProfile, StateBytes

__all__ = [
    "CommCost",
    "ContextCache",
    "CostContext",
    "CostPass",
    "Estimate",
    "Passes",
    "MEGATRON_LM_2021",
    "PLANC_RUNTIME",
    "PROFILES",
    "RuntimeProfile",
    "StageMemory",
    "StateBytes",
    "Term",
    "base_estimate",
    "build_context",
    "evaluate",
    "finalize",
    "run_passes",
]
