"""The order strategies compose in: the built-ins' chain, and the graph every registry sorts.

Each strategy's ``AFTER`` names the strategies that must be applied before it when both are
active; :func:`composition_graph` turns them into a networkx DiGraph whose topological sort is
the composition order (:meth:`planc.strategies.registry.Registry.order`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

import networkx as nx

#: The composition order of the built-ins, outermost transformation first (each one's AFTER says
#: the same thing edge by edge; tests check that the sort reproduces this list).
#: Pipeline parallelism splits the model into stages, so everything after it runs per stage;
#: tensor parallelism addresses modules by name, so it comes before anything that wraps them;
#: recomputation wraps whole (already sharded) blocks; precision hands FSDP its policy, which
#: FSDP2 only takes when it wraps; data parallelism (DDP / ZeRO / FSDP) comes last.
BUILTIN_ORDER = ("pipeline", "tensor_parallel", "recompute", "bf16", "ddp", "zero1", "fsdp")


def after(name: str) -> tuple[str, ...]:
    """The built-ins that come before ``name`` (its AFTER)."""
    order = BUILTIN_ORDER[: BUILTIN_ORDER.index(name)]
    if name in ("zero1", "fsdp"):  # the three data-parallel strategies exclude each other
        order = tuple(n for n in order if n not in ("ddp", "zero1"))
    return order


class Ordered(Protocol):
    """What the graph needs of a strategy: its name and its AFTER."""

    @property
    def name(self) -> str: ...

    @property
    def after(self) -> tuple[str, ...]: ...


def composition_graph(strategies: Iterable[Ordered]) -> nx.DiGraph:
    """Edge a -> b when b must come after a (b lists a in AFTER); names not among ``strategies`` are ignored."""
    strategies = list(strategies)
    graph = nx.DiGraph()
    graph.add_nodes_from(s.name for s in strategies)
    for strategy in strategies:
        for before in strategy.after:
            if before in graph:
                graph.add_edge(before, strategy.name)
    return graph


if TYPE_CHECKING:  # mypy checks every built-in module against the typed contract
    from planc.strategies import bf16, ddp, fsdp, pipeline, recompute, tensor_parallel, zero1
    from planc.strategies.api import Strategy

    _pipeline: Strategy = pipeline
    _tensor_parallel: Strategy = tensor_parallel
    _recompute: Strategy = recompute
    _bf16: Strategy = bf16
    _ddp: Strategy = ddp
    _zero1: Strategy = zero1
    _fsdp: Strategy = fsdp
