"""Layout legality: the rules a layout must keep (:mod:`planc.legality.rules`) and the legal
values of each layout key of a plan (:mod:`planc.legality.space`), in one place.

The spec checks, :class:`~planc.spec.Layout`, the planner and the built-in strategies all ask
here; nothing else decides whether a layout can run. Importing this package imports no other
planc module but :mod:`planc.stages` (the spec imports it).
"""

from planc.legality.rules import Violation
from planc.legality.space import why_no_layout

__all__ = ["Violation", "why_no_layout"]
