"""The :class:`CommCost`: one process group's traffic in a step, as the cost passes price it and
``planc explain`` and ``planc verify`` show it (re-exported by :mod:`planc.cost.estimate`)."""

from __future__ import annotations

from dataclasses import dataclass

from planc.cost.frozen import replace


@dataclass(frozen=True, slots=True)
class CommCost:
    """Communication of one process group per step."""

    group: str
    """"tp", "dp", "pp", or a name a plugin chooses."""
    volume: float
    """Bytes each device sends per step."""
    total: float
    """Seconds the transfers take if nothing overlaps them."""
    exposed: float
    """Seconds they add to the step (not hidden behind compute)."""
    medium: str = ""
    """Links crossed: "nvlink", "network" or "local"."""
    detail: str = ""
    """What the traffic is, for explain (e.g. "all-reduce fp32 gradients")."""
    volume_by_pp_rank: tuple[float, ...] = ()
    """Bytes each pipeline rank's devices move, where the ranks differ (empty: ``volume`` on every
    rank); ``volume`` is what explain shows beside the seconds (the pipeline's: its busiest link's).
    A pass that adds to ``volume`` adds each rank's share here too (:meth:`scaled` does)."""

    def scaled(self, factor: float) -> CommCost:
        by_rank = tuple(v * factor for v in self.volume_by_pp_rank)
        return replace(
            self,
            volume=self.volume * factor,
            total=self.total * factor,
            exposed=self.exposed * factor,
            volume_by_pp_rank=by_rank,
        )

    def volume_of_pp_rank(self, pp_rank: int) -> float:
        """Bytes the devices of pipeline rank ``pp_rank`` move (``planc verify``'s per-rank rows)."""
        return self.volume_by_pp_rank[pp_rank] if self.volume_by_pp_rank else self.volume
