"""Stage arithmetic (planc.stages): the split, the placements, and the closed forms of the schedules
checked against the timeline simulator that replays them (planc.explain.timeline); zero-bubble's
moments (planc.zero_bubble) checked against torch's own orders."""

import itertools
from collections.abc import Iterator
from typing import NamedTuple

import pytest

from planc.cost.memory import micro_batches_holding_logits
from planc.explain.timeline import simulate
from planc.legality.rules import micro_batch_count
from planc.stages import (
    bubble_slots,
    chunk_layer_counts,
    chunks_in_flight,
    layer_ranges,
    rank_layer_counts,
    rank_of_stage,
    stages_of_rank,
)
from planc.zero_bubble import ZeroBubbleMoment, zbv_order, zero_bubble_moments, zero_bubble_peaks


def test_uneven_layers_go_to_the_first_stages():
    # 10 layers over 4 stages: 10 = 3 + 3 + 2 + 2
    assert chunk_layer_counts(10, 4) == (3, 3, 2, 2)
    assert layer_ranges(10, 4) == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    assert rank_layer_counts(10, 4) == (3, 3, 2, 2)
    # 10 layers over 2 ranks x 2 virtual stages: stages (3, 3, 2, 2); rank 0 holds stages 0 and 2.
    assert rank_layer_counts(10, 2, 2) == (5, 5)
    assert sum(rank_layer_counts(127, 16, 4)) == 127
    with pytest.raises(ValueError):
        chunk_layer_counts(4, 5)


def test_looped_and_v_placements():
    # looped: rank r holds r, r + p, ...; V (ZBV): rank r holds r and 2p - 1 - r
    assert stages_of_rank(1, 4, 2) == (1, 5)
    assert stages_of_rank(1, 4, 2, "v") == (1, 6)
    assert [rank_of_stage(s, 4, 2) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [rank_of_stage(s, 4, 2, "v") for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    for style in ("looped", "v"):
        for rank in range(4):
            assert all(rank_of_stage(s, 4, 2, style) == rank for s in stages_of_rank(rank, 4, 2, style))


def test_in_flight_by_hand():
    # GPipe: all m; 1F1B: p - rank; interleaved rank 0 (m a multiple of p): v p + p - 1 stages
    # (Korthikanti: L (1 + (p-1)/(p v))); ZB-H1: 1F1B's peak; ZB-V: 2p stages on every rank
    assert chunks_in_flight("gpipe", 4, 1, 16, 0) == 16
    assert chunks_in_flight("1f1b", 4, 1, 16, 0) == 4
    assert chunks_in_flight("1f1b", 4, 1, 16, 3) == 1
    assert chunks_in_flight("interleaved", 4, 2, 16, 0) == 2 * 4 + 4 - 1
    # m = 6 with p = 4 runs in one round of 6: (v - 1) 6 + 2 (p - 1) + 1 = 13, capped at v m = 12
    assert chunks_in_flight("interleaved", 4, 2, 6, 0) == 12
    assert chunks_in_flight("zero-bubble", 4, 1, 16, 0) == 4
    assert chunks_in_flight("zero-bubble", 4, 2, 16, 3) == 8  # 5 in flight + 3 waiting for weight gradients
    assert chunks_in_flight("zero-bubble", 4, 2, 16, 3, "v") == 8
    assert chunks_in_flight("1f1b", 8, 1, 3, 0) == 3  # capped by the micro-batches
    assert chunks_in_flight(None, 1, 1, 16, 0) == 1


def test_bubble_by_hand():
    # 1F1B, p 4, m 8: (p - 1) = 3 slots; interleaved v 2: 1.5; zero-bubble with equal passes
    # (f = w, b = 2 w): a third of 1F1B's, 1 slot
    assert bubble_slots("1f1b", 4, 1, 8) == 3
    assert bubble_slots("interleaved", 4, 2, 8) == 1.5
    assert bubble_slots("zero-bubble", 4, 1, 8) == pytest.approx(1.0)
    assert bubble_slots(None, 1, 1, 8) == 0


def _replayed(schedule: str, p: int, v: int, m: int, style: str) -> tuple[float, list[int]]:
    """(bubble in micro-batch slots on rank 0, peak stage-micro-batches in flight per rank) of a replay."""
    ops = simulate(schedule, p, v, m, style)
    end = max(o.end for o in ops)
    busy = sum(o.end - o.start for o in ops if o.rank == 0)
    peaks = []
    for rank in range(p):
        # activations are taken when a forward starts and freed when its backward ends
        events = sorted(
            (o.start, 1) if o.kind == "F" else (o.end, -1) for o in ops if o.rank == rank and o.kind in "FB"
        )
        held = peak = 0
        for _, change in events:
            held += change
            peak = max(peak, held)
        peaks.append(peak)
    return (end - busy) / (3 * v), peaks  # a slot: v stages of F (1) + B (2)


SCHEDULES = [
    ("gpipe", (1,), "looped"),
    ("1f1b", (1,), "looped"),
    ("interleaved", (2, 3, 4), "looped"),
    ("zero-bubble", (1, 2, 3, 4), "looped"),
    ("zero-bubble", (2,), "v"),
]


def _legal(schedule: str, vs: tuple[int, ...], style: str):
    for p in (2, 3, 4, 5, 8):
        for v in vs:
            for m in range(1, 4 * p + 2):
                if micro_batch_count(schedule, p, m, style) is None:
                    yield p, v, m


@pytest.mark.parametrize("schedule, vs, style", SCHEDULES, ids=[f"{s}-{st}" for s, _, st in SCHEDULES])
def test_closed_forms_equal_the_replayed_schedule(schedule, vs, style):
    """The cost model's bubble and in-flight counts are exactly what the replay of each schedule's
    operation order gives, for every legal micro-batch count (torch's rules, planc.legality).
    The replay's zero-bubble order is a drawing of the idea (weight passes in idle time); what
    torch's zero-bubble schedules hold is checked against torch's own order below."""
    checked = 0
    for p, v, m in _legal(schedule, vs, style):
        bubble, peaks = _replayed(schedule, p, v, m, style)
        assert bubble_slots(schedule, p, v, m, style=style) == pytest.approx(bubble), (p, v, m)
        if schedule != "zero-bubble":
            assert [chunks_in_flight(schedule, p, v, m, r, style) for r in range(p)] == peaks, (p, v, m)
        checked += 1
    assert checked > 40


def _torch_order(p: int, v: int, m: int, style: str) -> dict[int, list]:
    """torch's operation order for each rank of its zero-bubble schedules (the part of their
    constructor that plans it: no process group or stage needed)."""
    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble

    if style == "v":
        schedule = object.__new__(ScheduleZBVZeroBubble)
        schedule.pp_group_size, schedule._n_microbatches, schedule.n_local_stages = p, m, 2
        schedule.num_stages = 2 * p
        return {r: schedule._calculate_single_rank_operations(r) for r in range(p)}
    schedule = object.__new__(ScheduleInterleavedZeroBubble)
    schedule.pp_group_size, schedule._n_microbatches, schedule.n_local_stages = p, m, v
    schedule.number_of_rounds = max(1, m // p)
    schedule.microbatches_per_round = m // schedule.number_of_rounds
    schedule.pipeline_order = {r: schedule._calculate_single_rank_operations(r) for r in range(p)}
    return schedule._add_bubbles_to_actions(v * p)


class _Held(NamedTuple):
    """What a rank holds during one action of torch's zero-bubble order (:func:`_replay`)."""

    stage: int
    kind: object
    """The action's ``_ComputationType``."""
    alive: set[tuple[int, int]]
    """Stage-micro-batches holding activations: from their forward to their weight pass."""
    waiting: set[tuple[int, int]]
    """Of them, those holding output gradients: from their input pass to their weight pass."""
    weights_wait: set[int]
    """Stages whose weight gradients wait: from a weight pass to the stage's next input pass
    (FSDP2's post-backward hook fires in the input pass)."""
    accumulated: set[int]
    """Stages whose fp32 accumulation exists: made by the first input pass after a weight pass."""
    reduced: set[int]
    """Stages whose m weight passes are all done: reduce-scattered after the last."""


def _replay(actions: list, m: int) -> Iterator[tuple[str, _Held]]:
    """torch's zero-bubble order replayed with FSDP2's rules, one ``("start", held)`` per action
    once its forward or input pass has taken what it takes, and one ``("end", held)`` once the
    action is done. The first stage's input pass does nothing and its weight pass is its whole
    backward (torch's ``backward_one_chunk``: ``if not self.is_first``), hook included: it
    accumulates there and never waits."""
    from torch.distributed.pipelining.schedules import _ComputationType as Kind

    held = _Held(0, None, set(), set(), set(), set(), set())
    passes: dict[int, int] = {}
    for action in actions:
        if action is None:
            continue
        stage, kind = action.stage_index, action.computation_type
        held = held._replace(stage=stage, kind=kind)
        key = (stage, action.microbatch_index)
        if kind == Kind.FORWARD:
            held.alive.add(key)
        elif kind == Kind.BACKWARD_INPUT and stage != 0:
            held.waiting.add(key)
        yield "start", held
        if kind == Kind.BACKWARD_INPUT and stage != 0:
            if stage in held.weights_wait:
                held.accumulated.add(stage)
            held.weights_wait.discard(stage)
        elif kind in (Kind.BACKWARD_WEIGHT, Kind.FULL_BACKWARD):
            held.alive.discard(key)
            held.waiting.discard(key)
            if kind == Kind.BACKWARD_WEIGHT and stage != 0:
                held.weights_wait.add(stage)
            else:
                held.weights_wait.discard(stage)
                held.accumulated.add(stage)
            passes[stage] = passes.get(stage, 0) + 1
            if passes[stage] == m:
                held.reduced.add(stage)
        yield "end", held


def _after_each_action(actions: list, m: int) -> list[tuple[int, int, int]]:
    """(activations, output gradients, other stages' waiting weight gradients) held after each
    action of torch's order (:func:`_replay`), counted once for all the weights
    :func:`_weighted_peak` tries."""
    return [
        (len(held.alive), len(held.waiting), len(held.weights_wait - {held.stage}))
        for when, held in _replay(actions, m)
        if when == "end"
    ]


def _weighted_peak(counts: list[tuple[int, int, int]], ratio: float, weight_ratio: float = 0.0) -> float:
    """Largest activations + ``ratio`` x output gradients + ``weight_ratio`` x waiting weight
    gradients over :func:`_after_each_action`'s counts, the weight gradients counted for the
    stages other than the one the action runs."""
    return max([0.0, *(alive + ratio * waiting + weight_ratio * others for alive, waiting, others in counts)])


@pytest.mark.parametrize("vs, style", [((1, 2, 3, 4), "looped"), ((2,), "v")], ids=["looped", "v"])
def test_zero_bubble_holds_what_torchs_order_holds(vs, style):
    checked = 0
    for p, v, m in _legal("zero-bubble", vs, style):
        order = _torch_order(p, v, m, style)
        counts = [_after_each_action(order[r], m) for r in range(p)]
        held = [_weighted_peak(counts[r], ratio=0.0) for r in range(p)]  # activations alone
        assert [chunks_in_flight("zero-bubble", p, v, m, r, style) for r in range(p)] == held, (p, v, m)
        # output gradients and waiting weight gradients of a stage(-micro-batch) / its activations
        for ratio, weight_ratio in itertools.product((0.25, 1.0, 1.5, 4.0), (0.0, 0.5, 1.0, 3.0, 10.0)):
            for r in range(p):
                candidates = zero_bubble_peaks(p, v, m, r, style)
                predicted = max(a + ratio * d + weight_ratio * w for a, d, w in candidates)
                replayed = _weighted_peak(counts[r], ratio, weight_ratio)
                if style == "v" and m < 2 * p - 1:  # torch drops the micro-batches it planned for: a bound
                    assert predicted >= replayed, (p, v, m, r, ratio, weight_ratio)
                else:
                    assert predicted == pytest.approx(replayed), (p, v, m, r, ratio, weight_ratio)
        checked += 1
    assert checked > 20


def test_zero_bubble_weight_gradients_waiting_by_hand():
    # torch's ScheduleInterleavedZeroBubble, p 4, v 2, 16 micro-batches (rank 1: stages 1 and 5):
    # ... 1I4 1W4 5F8 ... 5I8 ... -- from the second round on, while stage 5 runs its input pass
    # stage 1 has run a weight pass (1W7) whose gradients wait for 1I8, and the other way round:
    # one other stage waits at the peak, 8 stage-micro-batches held, 2 output gradients waiting.
    assert zero_bubble_peaks(4, 2, 16, 1) == ((8, 2, 1),)
    # One round (m = 4 = p): a stage's gradients wait only once its backwards are done; on rank 1
    # stage 5 finishes first (5W3), when the rank holds 8 - (4 - 1) = 5 stage-micro-batches.
    assert zero_bubble_peaks(4, 2, 4, 1) == ((8, 2, 0), (5, 2, 1))
    # Rank 0 holds stage 0, whose whole backward (hook included) is its weight pass: in stage 4's
    # input pass nothing else waits; in stage 0's weight pass stage 4's gradients wait.
    assert zero_bubble_peaks(4, 2, 16, 0) == ((8, 1, 0), (8, 0, 1))
    # v = 3 keeps both other stages waiting (rank 2 of p 4, 12 micro-batches, g = 4).
    assert zero_bubble_peaks(4, 3, 12, 2) == ((12, 3, 2),)


def _as_each_action_starts(actions: list, m: int) -> list[tuple[int, int, int, int, int, bool]]:
    """(activations, output gradients, stages' weight gradients in compute precision, stages' fp32
    accumulations, stages reduced, whether it is a weight pass) as each action of torch's order
    starts (:func:`_replay`), with FSDP2's rules: a stage's weight pass leaves its gradients in
    compute precision until its next input pass, whose post-backward hook makes (the first time)
    or adds into its fp32 accumulation; after a stage's last weight pass of the step its
    gradients are reduce-scattered, in compute precision and fp32 alike. Counted once for all the
    sizes :func:`_gradients_peak` tries."""
    from torch.distributed.pipelining.schedules import _ComputationType as Kind

    return [
        (
            len(held.alive),
            len(held.waiting),
            len(held.weights_wait - held.reduced),
            len(held.accumulated - held.reduced),
            len(held.reduced),
            held.kind == Kind.BACKWARD_WEIGHT,
        )
        for when, held in _replay(actions, m)
        if when == "start"
    ]


def _gradients_peak(counts: list, a: float, d: float, e: float, g: float, n: float, r: float = 0.0) -> float:
    """Largest a x activations + d x output gradients + e x stages' weight gradients in compute
    precision (the other stages' waiting and the running stage's own) + g x stages' fp32
    accumulations + n x a weight pass's new gradients + r x a reduced stage's sharded gradients
    (less its parameters, resharded) over :func:`_as_each_action_starts`' counts."""
    return max(
        [
            0.0,
            *(
                a * alive + d * waiting + e * bf16 + g * fp32 + r * reduced + (n if weight_pass else 0.0)
                for alive, waiting, bf16, fp32, reduced, weight_pass in counts
            ),
        ]
    )


def _moments_peak(moments, v: int, a: float, d: float, e: float, g: float, n: float, r: float = 0.0) -> float:
    """The largest of :func:`_gradients_peak`'s sum over the moments of planc.zero_bubble.zero_bubble_moments."""
    return max(
        a * c.held
        + d * c.waiting
        + e * (c.weights + ((c.weight_pass or c.input_pass) and c.running_grads))
        + g * (v - c.first_waits if c.accumulations is None else c.accumulations)
        + n * c.weight_pass
        + r * c.reduced
        for c in moments
    )


def test_zero_bubbles_last_rank_with_two_rounds_peaks_where_torchs_order_keeps_its_gradients():
    """The last rank with m = 2 p: the other stages' first weight gradients wait without an fp32
    accumulation, and the rank's peak can be in its last stage's weight pass
    (planc.zero_bubble.zero_bubble_moments), for every legal p and v, whatever the sizes' ratios
    (fp32 accumulation twice the compute-precision gradients, a group's new ones at most a stage's)."""
    checked = 0
    for p, v, m in _legal("zero-bubble", (2, 3, 4), "looped"):
        if m != 2 * p:
            continue
        counts = _as_each_action_starts(_torch_order(p, v, m, "looped")[p - 1], m)
        for a, d, n in itertools.product((0.1, 0.5, 1.0, 4.0), (0.25, 1.0), (0.3, 0.67, 1.0)):
            e, g = 1.0, 2.0
            predicted = _moments_peak(zero_bubble_moments(p, v, m, p - 1), v, a, d, e, g, n)
            assert predicted == pytest.approx(_gradients_peak(counts, a, d, e, g, n)), (p, v, a, d, n)
        checked += 1
    assert checked >= 8
    # By hand, p 4, v 2 (torch's order on rank 3: ... 7F7 7I7 7W4 3I4 7W5 ...): in 7W4, 8 held, 4
    # waiting, stage 3's first weight gradients (no fp32 yet), stage 7's accumulated at 7I4 with no
    # weight pass since; in 7W5, after 3I4 made stage 3's accumulation, 7 held and 7W4's beside 7W5's.
    assert tuple(c[:6] for c in zero_bubble_moments(4, 2, 8, 3)) == (  # two rounds: no field after weight_pass
        (8, 4, 1, 1, False, True),
        (7, 4, 0, 0, True, True),
    )
    assert zero_bubble_moments(4, 2, 16, 3) == (ZeroBubbleMoment(8, 4, 1, 0, True, False),)  # four rounds: as before


def test_zero_bubble_with_one_round_peaks_where_torchs_order_keeps_its_gradients():
    """Every looped rank with one round of micro-batches (p <= m < 2 p): its stages' weight passes
    run one stage after another, the done ones reduced, the later ones with no gradient yet, the
    running one's fp32 accumulation made only by an input pass after its first weight pass
    (planc.zero_bubble.zero_bubble_moments), for every legal p and v, whatever the sizes' ratios
    (fp32 accumulation twice the compute-precision gradients; a reduced stage's sharded gradients
    less its resharded parameters below, at or above nothing)."""
    checked = 0
    for p, v, m in _legal("zero-bubble", (1, 2, 3, 4), "looped"):
        if m >= 2 * p:
            continue
        order = _torch_order(p, v, m, "looped")
        for rank in range(p):
            moments = zero_bubble_moments(p, v, m, rank)
            counts = _as_each_action_starts(order[rank], m)
            for a, d, n, r in itertools.product((0.1, 0.5, 1.0, 4.0), (0.25, 1.0), (0.3, 1.0), (-0.5, 0.0, 0.5)):
                predicted = _moments_peak(moments, v, a, d, 1.0, 2.0, n, r)
                assert predicted == pytest.approx(_gradients_peak(counts, a, d, 1.0, 2.0, n, r)), (
                    p,
                    v,
                    m,
                    rank,
                    (a, d, n, r),
                )
        checked += 1
    assert checked >= 20
    # By hand, p 4, v 2, m 4 (torch's order on rank 0: 0F0-0F3 4F0-4F3 4I0 4W0 4I1 4W1 4I2 4W2 ...
    # 4W3 0I0 0W0 ...): 4W0 holds all 8 stage-micro-batches and no gradient but the running
    # group's; 4W1, after 4I1 made stage 4's fp32 accumulation from 4W0's gradients, 7; 4I2 holds 6,
    # 4W1's gradients beside the accumulation; stage 0 runs with stage 4 reduced, 0W1 with 3 held.
    # On rank 3 every input pass of stage 7 comes before its first weight pass (7F3 7I3 7W0 3I0
    # 7W1): no accumulation is ever made, and from 7W1 on each weight pass finds the previous one's.
    assert zero_bubble_moments(4, 2, 4, 0) == (
        ZeroBubbleMoment(8, 1, 0, running_grads=False, weight_pass=True, accumulations=0),
        ZeroBubbleMoment(7, 1, 0, running_grads=False, weight_pass=True, accumulations=1),
        ZeroBubbleMoment(6, 1, 0, input_pass=True, accumulations=1),
        ZeroBubbleMoment(4, 0, 0, running_grads=False, weight_pass=True, accumulations=0, reduced=1),
        ZeroBubbleMoment(3, 0, 0, running_grads=False, weight_pass=True, accumulations=1, reduced=1),
    )
    assert ZeroBubbleMoment(7, 4, 0, weight_pass=True, accumulations=0) in zero_bubble_moments(4, 2, 4, 3)


def test_zbv_order_is_torchs():
    """planc.zero_bubble.zbv_order, which the timeline and the cost model replay, is torch's own order,
    the micro-batches it plans for but does not have dropped (m < 2 p - 1) included."""
    from torch.distributed.pipelining.schedules import _ComputationType as Kind

    kinds = {Kind.FORWARD: "F", Kind.BACKWARD_INPUT: "B", Kind.BACKWARD_WEIGHT: "W"}
    for p in range(2, 9):
        for m in range(1, 4 * p + 2):
            order = _torch_order(p, 2, m, "v")
            for rank in range(p):
                torchs = [(kinds[a.computation_type], a.stage_index, a.microbatch_index) for a in order[rank] if a]
                assert zbv_order(p, m, rank) == torchs, (p, m, rank)


def test_zbv_with_fewer_micro_batches_than_planned_peaks_where_torchs_order_keeps_its_gradients():
    """ZB-V with m < 2 p - 1, where torch drops the micro-batches it planned the V for: every
    rank's moments (planc.zero_bubble.zero_bubble_moments) give the peak of torch's order replayed with
    FSDP2's rules, for every legal p and m, whatever the sizes' ratios (fp32 accumulation twice the
    compute-precision gradients; a reduced stage's sharded gradients less its resharded parameters
    below, at or above nothing)."""
    checked = 0
    for p, _, m in _legal("zero-bubble", (2,), "v"):
        if m >= 2 * p - 1:
            continue
        order = _torch_order(p, 2, m, "v")
        for rank in range(p):
            moments = zero_bubble_moments(p, 2, m, rank, "v")
            counts = _as_each_action_starts(order[rank], m)
            for a, d, n, r in itertools.product((0.1, 0.5, 1.0, 4.0), (0.25, 1.0), (0.3, 1.0), (-0.5, 0.0, 0.5)):
                predicted = _moments_peak(moments, 2, a, d, 1.0, 2.0, n, r)
                assert predicted == pytest.approx(_gradients_peak(counts, a, d, 1.0, 2.0, n, r)), (p, m, rank)
        checked += 1
    assert checked >= 30
    # By hand, p 4, m 4 (torch's order on rank 0: 0F0-0F3 7F0 7I0 7W0 7F1 7I1 7W1 ... 7F3 7I3 7W3
    # 0I0 0W0 ...; 0F4-0F6 and 7F4-7F6 dropped): the head's stage 7 runs all its backwards before
    # stage 0's first, so in 7I3 the rank holds 5 stage-micro-batches (4 of stage 0, 1 of stage 7),
    # stage 7's accumulation (made at 7I1) with 7W2's gradients beside it, and nothing of stage 0;
    # 0W0 finds stage 7 reduced (REDUCE_GRAD after 7W3) and 4 held.
    rank0 = zero_bubble_moments(4, 2, 4, 0, "v")
    assert ZeroBubbleMoment(5, 1, 0, input_pass=True, accumulations=1, running=0) in rank0
    first_weight_pass = ZeroBubbleMoment(4, 0, 0, 0, False, True, accumulations=0, reduced=1, running=1)
    assert first_weight_pass in rank0
    # Rank 2 (stages 2 and 5: ... 5W1 2I0 2W0 5I2 5W2 2I1 2W1 5I3 ...): in 2W1, after 2I1 made stage
    # 2's accumulation from 2W0's gradients, both stages accumulate and 5W2's gradients wait for 5I3.
    assert ZeroBubbleMoment(4, 1, 1, running_grads=False, weight_pass=True, accumulations=2, running=1) in (
        zero_bubble_moments(4, 2, 4, 2, "v")
    )


def _head_micro_batches_alive(actions: list, head_stage: int) -> int:
    """Most micro-batches of the head stage between their forward and their weight pass."""
    from torch.distributed.pipelining.schedules import _ComputationType as Kind

    alive: set[int] = set()
    peak = 0
    for action in actions:
        if action is None or action.stage_index != head_stage:
            continue
        if action.computation_type == Kind.FORWARD:
            alive.add(action.microbatch_index)
        elif action.computation_type in (Kind.BACKWARD_WEIGHT, Kind.FULL_BACKWARD):
            alive.discard(action.microbatch_index)
        peak = max(peak, len(alive))
    return peak


@pytest.mark.parametrize("vs, style", [((1, 2, 3, 4), "looped"), ((2,), "v")], ids=["looped", "v"])
def test_zero_bubble_head_holds_the_logits_torchs_order_holds(vs, style):
    """With the loss's gradient computed in the forward, a micro-batch's logits live from its forward
    to its weight pass (planc.cost.memory.micro_batches_holding_logits)."""
    checked = 0
    for p, v, m in _legal("zero-bubble", vs, style):
        if style == "v" and m < 2 * p - 1:  # torch drops the micro-batches it planned for
            continue
        order = _torch_order(p, v, m, style)
        rank, head = (0, 2 * p - 1) if style == "v" else (p - 1, p * v - 1)
        assert micro_batches_holding_logits("zero-bubble", p, m, "chunked", style) == _head_micro_batches_alive(
            order[rank], head
        ), (p, v, m)
        checked += 1
    assert checked > 20


def test_the_busiest_pair_of_ranks_shares_v_boundaries_or_2v_minus_1_with_two():
    from planc.stages import busiest_rank_pair_boundaries

    # looped, pp 4 v 2: stages 0..7 on ranks 0 1 2 3 0 1 2 3; ranks 0-1 meet at 0->1 and 4->5
    assert busiest_rank_pair_boundaries(4, 2) == 2
    # pp 2 v 2: 0->1, 1->2 (the wrap) and 2->3 all join ranks 0 and 1
    assert busiest_rank_pair_boundaries(2, 2) == 3
    assert busiest_rank_pair_boundaries(2, 3) == 5
    assert busiest_rank_pair_boundaries(2, 1) == 1 and busiest_rank_pair_boundaries(8, 1) == 1
    # V, pp 4: stages 0..7 on ranks 0 1 2 3 3 2 1 0; 3->4 stays on rank 3
    assert busiest_rank_pair_boundaries(4, 2, "v") == 2


@pytest.mark.parametrize("pp, v", [(2, 2), (4, 2), (2, 3)])
def test_the_busiest_pair_matches_torchs_interleaved_schedule(pp, v):
    """Count the sends between each pair of ranks in the actions torch's ScheduleInterleaved1F1B
    runs (its order with the send/receive actions added, as it executes them)."""
    from collections import Counter
    from types import SimpleNamespace

    from planc.stages import busiest_rank_pair_boundaries

    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    if not hasattr(schedules, "_add_send_recv"):
        pytest.skip("this torch has no _add_send_recv")
    m = 4 * pp
    stages = [SimpleNamespace(group_size=pp, group_rank=0, stage_index=c * pp, num_stages=pp * v) for c in range(v)]
    order = schedules.ScheduleInterleaved1F1B(stages, m).pipeline_order
    actions = schedules._add_send_recv(
        {r: [a for a in acts if a is not None] for r, acts in order.items()}, lambda s: s % pp, pp * v
    )
    sends = Counter()
    for rank, acts in actions.items():
        for a in acts:
            if a.computation_type == schedules.SEND_F:
                sends[frozenset((rank, (a.stage_index + 1) % pp))] += 1
            elif a.computation_type == schedules.SEND_B:
                sends[frozenset((rank, (a.stage_index - 1) % pp))] += 1
    assert max(sends.values()) == 2 * m * busiest_rank_pair_boundaries(pp, v)
