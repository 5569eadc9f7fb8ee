"""The planner: search the layouts a plan leaves ``auto`` and pick the smallest that fits.

Public API (the code generator calls it)::

    from planc.planner import choose
    choice = choose(plan, tolerance=None, top_k=5)
    choice.layout        # planc.spec.Layout
    choice.estimate      # planc.cost.Estimate: memory_bytes, capacity, step_s, tokens_per_s, ...
    choice.fits          # bool
    choice.rejected      # simpler rungs and the number that ruled each out
    choice.alternatives  # the next-best fitting layouts

See docs/planner.md for the ladder, the complexity rank and the tolerance rule.
"""

from planc.planner.choose import Choice, NoLegalLayout, Rejection, choose, is_fully_fixed, step_parts, suggest_fix
from planc.planner.explore import Candidate, SearchResult, search
from planc.planner.ladder import RUNGS, complexity, rung_of

__all__ = [
    "Candidate",
    "Choice",
    "NoLegalLayout",
    "RUNGS",
    "Rejection",
    "SearchResult",
    "choose",
    "complexity",
    "is_fully_fixed",
    "rung_of",
    "search",
    "step_parts",
    "suggest_fix",
]
