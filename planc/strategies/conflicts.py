"""What the registry decides between plugins after importing them: who keeps a name two
distributions claim (the core decides: a built-in always; two third-party plugins, neither), and
which third-party strategies an ``AFTER`` cycle leaves out. Each decision is a
:class:`~planc.strategies.contract.PluginProblem` naming the distributions involved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import networkx as nx

from planc.errors import did_you_mean
from planc.strategies.composition import composition_graph
from planc.strategies.contract import LoadedStrategy, PluginProblem

if TYPE_CHECKING:
    from planc.strategies.registry import Registry


def settle_collision(
    name: str, claims: list[LoadedStrategy], problems: list[PluginProblem]
) -> dict[str, LoadedStrategy]:
    if len(claims) == 1:
        return {name: claims[0]}
    builtins = [c for c in claims if c.builtin]
    winner = builtins[0] if builtins else None
    for claim in claims:
        if claim is winner:
            continue
        if winner is not None:
            message = (
                f"the name '{name}' belongs to planc's built-in strategy; this plugin cannot replace it "
                "(rename it, e.g. '{}_{}')".format(claim.distribution.replace("-", "_"), name)
            )
        else:
            others = ", ".join(f"{c.distribution} {c.version}" for c in claims if c is not claim)
            message = (
                f"the name '{name}' is also registered by {others}; planc cannot tell which one "
                "`use` means, so both are skipped (uninstall one, or ask an author to rename it)"
            )
        problems.append(PluginProblem(name, claim.distribution, claim.version, message))
    return {name: winner} if winner is not None else {}


def drop_cycles(registry: Registry, registered_names: set[str]) -> None:
    """Report unknown AFTER names (a warning) and skip third-party strategies caught in an AFTER cycle."""
    for strategy in registry.strategies.values():
        for before in strategy.after:
            if before not in registered_names:
                registry.problems.append(
                    PluginProblem(
                        strategy.name,
                        strategy.distribution,
                        strategy.version,
                        f"AFTER names '{before}', which no installed distribution registers; that ordering "
                        "constraint is ignored"
                        + (
                            f" ({did_you_mean(before, registered_names)})"
                            if did_you_mean(before, registered_names)
                            else ""
                        ),
                        skipped=False,
                    )
                )
    graph = composition_graph(registry.strategies.values())
    while True:
        try:
            cycle = nx.find_cycle(graph)
        except nx.NetworkXNoCycle:
            return
        names = [edge[0] for edge in cycle]
        path = " -> ".join(names + [names[0]])
        culprits = [n for n in names if not registry.strategies[n].builtin] or names
        for name in culprits:
            strategy = registry.strategies.pop(name)
            graph.remove_node(name)
            registry.problems.append(
                PluginProblem(
                    name,
                    strategy.distribution,
                    strategy.version,
                    f"its AFTER declaration closes an ordering cycle ({path}); fix AFTER so the order is a chain",
                )
            )
