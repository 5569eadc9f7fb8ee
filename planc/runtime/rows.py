"""Which rows of a global batch a data-parallel rank trains on: arithmetic shared by every data source."""

from __future__ import annotations


def check_rows(start: int, stop: int, global_batch: int) -> None:
    """Refuse a row range outside the global batch (a source never pads or wraps a batch)."""
    if not 0 <= start < stop <= global_batch:
        raise ValueError(f"rows {start}..{stop - 1} are not rows of a global batch of {global_batch}")


def rank_rows(global_batch: int, dp_rank: int, dp: int, micro_batch: int) -> tuple[int, int]:
    """The rows ``(start, stop)`` of a global batch that data-parallel rank ``dp_rank`` trains on.

    Rank r gets rows [r*G/dp, (r+1)*G/dp), cut later into micro-batches of ``micro_batch``
    consecutive rows, so the dp ranks and their micro-batches together cover every row exactly once.
    """
    if not 0 <= dp_rank < dp:
        raise ValueError(f"dp_rank {dp_rank} outside 0..{dp - 1}")
    if global_batch % dp:
        raise ValueError(f"global batch {global_batch} is not divisible by dp = {dp}")
    per_rank = global_batch // dp
    if per_rank % micro_batch:
        raise ValueError(
            f"{per_rank} sequences per data-parallel rank are not divisible by micro_batch = {micro_batch}"
        )
    return dp_rank * per_rank, (dp_rank + 1) * per_rank
