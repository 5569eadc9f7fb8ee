"""``ParallelDims``: the one value object that names the mesh dimensions.

The planner, the emitted program and the runtime all use it, so "pp, dp, tp" mean the same
thing everywhere and the mesh is always laid out the same way: tp innermost (adjacent ranks,
so a TP group stays inside a node), then dp, then pp outermost (torchtitan's order).
"""

from __future__ import annotations

from dataclasses import dataclass

#: Mesh dimension names, outermost first. Rank = (pp_rank * dp + dp_rank) * tp + tp_rank.
MESH_DIM_NAMES = ("pp", "dp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of pipeline, data and tensor parallelism; their product is the world size."""

    tp: int
    pp: int
    dp: int
    world_size: int

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "world_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        product = self.tp * self.pp * self.dp
        if product != self.world_size:
            raise ValueError(
                f"tp x pp x dp = {self.tp} x {self.pp} x {self.dp} = {product}, but the world size is {self.world_size}"
            )

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        """Sizes in the order of :data:`MESH_DIM_NAMES`."""
        return (self.pp, self.dp, self.tp)

    @property
    def mesh_dim_names(self) -> tuple[str, str, str]:
        return MESH_DIM_NAMES

    def coordinates(self, rank: int) -> dict[str, int]:
        """``{"pp": i, "dp": j, "tp": k}`` of a global rank on the mesh."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of {self.world_size}")
        return {"pp": rank // (self.dp * self.tp), "dp": (rank // self.tp) % self.dp, "tp": rank % self.tp}
