"""The planner: search the layouts a plan leaves ``auto`` and pick the smallest that fits.

Public API (the code generator calls it)::

    from planc.planner import choose
    choice = choose(plan, registry, tolerance=None, top_k=5)
    choice.layout        # planc.spec.Layout
    choice.estimate      # planc.cost.Estimate: memory_bytes, capacity, step_s, tokens_per_s, ...
    choice.fits          # bool
    choice.rejected      # simpler rungs: which limit ruled each out, with its numbers
    choice.alternatives  # the next-best fitting layouts
    choice.suggestion    # when nothing fits: what would (a Suggestion)

The planner returns data, never prose: :mod:`planc.explain.words` words its rejections and
suggestions.

See docs/planner.md for the ladder, the complexity rank and the tolerance rule.
"""

from planc.planner.choose import Choice, NoLegalLayout, choose, is_fully_fixed
from planc.planner.explore import Candidate, SearchResult, search
from planc.planner.ladder import RUNGS, Rung, complexity, rung_of
from planc.planner.rejections import Limit, Rejection
from planc.planner.suggest import Suggestion, suggest_fix

__all__ = [
    "Candidate",
    "Choice",
    "Limit",
    "NoLegalLayout",
    "RUNGS",
    "Rejection",
    "Rung",
    "SearchResult",
    "Suggestion",
    "choose",
    "complexity",
    "is_fully_fixed",
    "rung_of",
    "search",
    "suggest_fix",
]
