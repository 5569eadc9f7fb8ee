"""Which of an interleaved rank's stages hold gradients at its peak (planc.stages.interleaved_peaks),
checked against torch's own ScheduleInterleaved1F1B order, and what the cost model makes of it."""

import itertools

import pytest

from planc.legality.rules import micro_batch_count
from planc.stages import interleaved_peaks


def _torch_order(p: int, v: int, m: int) -> dict[int, list]:
    """torch's operation order for each rank of ScheduleInterleaved1F1B (the part of its
    constructor that plans it: no process group or stage needed)."""
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    schedule = object.__new__(ScheduleInterleaved1F1B)
    schedule.pp_group_size, schedule._n_microbatches, schedule.n_local_stages = p, m, v
    schedule.number_of_rounds = max(1, m // p)
    schedule.microbatches_per_round = m // schedule.number_of_rounds
    return {r: [a for a in schedule._calculate_single_rank_operations(r) if a is not None] for r in range(p)}


def _replayed(actions: list) -> list[tuple[int, int]]:
    """(stage-micro-batches alive, stages whose backward has begun) as each backward of ``actions``
    starts: the forwards' activations live until their backward; a stage's gradients exist from
    its first backward on (the running one's included: it makes them as it goes)."""
    from torch.distributed.pipelining.schedules import _ComputationType as Kind

    alive: set[tuple[int, int]] = set()
    begun: set[int] = set()
    moments = []
    for action in actions:
        key = (action.stage_index, action.microbatch_index)
        if action.computation_type == Kind.FORWARD:
            alive.add(key)
            continue
        begun.add(action.stage_index)
        moments.append((len(alive), len(begun)))
        alive.discard(key)
    return moments


def _legal():
    for p in (2, 3, 4, 5, 8):
        for v in (2, 3, 4):
            for m in range(1, 4 * p + 2):
                if micro_batch_count("interleaved", p, m) is None:
                    yield p, v, m


def test_interleaved_peaks_are_torchs():
    """For activations a and gradients g per stage, the largest a x held + g x stages begun over
    the candidates is the largest over torch's order replayed, for several ratios of the two."""
    checked = 0
    for p, v, m in _legal():
        order = _torch_order(p, v, m)
        for rank, (a, g) in itertools.product(range(p), ((1.0, 0.0), (1.0, 0.5), (1.0, 1.5), (1.0, 6.0))):
            replay = max(a * held + g * begun for held, begun in _replayed(order[rank]))
            model = max(a * held + g * begun for held, begun in interleaved_peaks(p, v, m, rank))
            assert model == pytest.approx(replay), (p, v, m, rank, a, g)
        checked += 1
    assert checked > 100


def test_interleaved_peaks_by_hand():
    # torch's order, p 2, v 2, m 2, rank 1 (stages 1 and 3): 1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1.
    # At 3B0 and 3B1 three stage-micro-batches are alive, stage 3 alone has begun; at 1B0 two.
    assert interleaved_peaks(2, 2, 2, 1) == ((3, 1), (2, 2))
    # With two rounds (m 4) stage 1's first backward (the third) comes in the steady phase.
    assert interleaved_peaks(2, 2, 4, 1) == ((3, 2),)
