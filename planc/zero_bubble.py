"""Zero-bubble's split backward on a pipeline rank, read off torch's own orders: where the rank's
memory can peak -- stage-micro-batches holding activations, output gradients waiting for their
weight pass, FSDP's weight gradients waiting for their stage's next input pass -- and what FSDP2
keeps of the gradients at each such moment.

Looped (torch ``ScheduleInterleavedZeroBubble``) and V-shaped (``ScheduleZBVZeroBubble``, whose
order :func:`zbv_order` writes out); tests/test_stages.py replays torch's orders with FSDP2's
rules and checks every count here against them. The cost model prices the moments
(:func:`planc.cost.data_parallel.moment_gradients`, ``planc.strategies.pipeline.cost_pass``).

Pure integer arithmetic, on :mod:`planc.stages`' placements; no torch, no pydantic.
"""

from __future__ import annotations

from typing import NamedTuple

from planc.stages import StageStyle, chunks_in_flight, interleaved_rounds, stages_of_rank


def zbv_order(pp: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """The (kind, stage, micro-batch) sequence rank ``rank`` issues under ZB-V (Qi et al. 2023,
    Sec. 6; torch ``ScheduleZBVZeroBubble._calculate_single_rank_operations``), kinds "F"
    (forward), "B" (input-gradient pass) and "W" (weight-gradient pass): the rank's first stage
    fills the pipeline, its second stage (the V's way back) starts the backward passes, and weight
    gradients follow their input gradients except in the warm-up and cool-down, where they wait.

    Planned for max(2p - 1, m) micro-batches and cut to the m that exist, as torch does (a test
    checks it against torch's own for every p <= 8 and m). ``planc explain``'s timeline replays it,
    and :func:`zero_bubble_moments` reads FSDP's gradients off it where torch drops micro-batches.
    """
    stages = stages_of_rank(rank, pp, 2, "v")
    n = max(2 * pp - 1, m)
    ops: list[tuple[str, int, int]] = []
    issued = {"F": [0, 0], "B": [0, 0], "W": [0, 0]}  # per kind, per local stage (0: first, 1: second)

    def issue(kind: str, local: int) -> None:
        ops.append((kind, stages[local], issued[kind][local]))
        issued[kind][local] += 1

    forwards, backwards, weights = issued["F"], issued["B"], issued["W"]
    for _ in range(2 * (pp - rank) - 1):
        issue("F", 0)
    for _ in range(rank):
        issue("F", 1)
        issue("F", 0)
    for _ in range(pp - rank):
        for kind in "FBW":
            issue(kind, 1)
    while forwards[1] < forwards[0] or forwards[0] < n:
        if forwards[0] < n:
            issue("F", 0)
        issue("B", 0)
        issue("W", 0)
        for kind in "FBW":
            issue(kind, 1)
    for _ in range(rank):
        issue("B", 0)
        issue("B", 1)
    for _ in range(pp - rank):
        issue("B", 0)
        issue("W", 0)
    for local in (1, 0):
        while weights[local] < backwards[local]:
            issue("W", local)
    return [op for op in ops if op[2] < m]


def zero_bubble_peaks(
    pp: int, v: int, m: int, rank: int, style: StageStyle = "looped"
) -> tuple[tuple[int, int, int], ...]:
    """Where a zero-bubble rank's peak can be: (stage-micro-batches holding activations, of them
    those whose output gradients wait for the weight-gradient pass, other stages of the rank whose
    weight gradients wait for their next input pass), one triple per candidate; the peak is the
    largest of a x activations + d x output gradients
    (:func:`planc.cost.memory.split_backward_output_grads`) + w x a stage's weight gradients
    (:func:`planc.cost.data_parallel.weight_pass_gradient_bytes`).

    A stage-micro-batch keeps its output gradients from the start of its input-gradient pass to
    the end of its weight-gradient pass. A stage's weight gradients wait from its weight pass to
    its next input pass, where FSDP2's post-backward hook adds them into the accumulated ones; the
    stage running is the backward's own term, so w counts the rank's *other* stages. The first
    stage (its input is token ids) has no input pass: torch runs its whole backward in the weight
    pass, hook included, so it keeps no output gradients and its weight gradients never wait.
    Read off torch's own order (tests/test_stages.py checks every legal p <= 8, v <= 4, m at
    several ratios of the three sizes):

    - looped: at the activations' peak (:func:`chunks_in_flight`) rank i > 0 has i + 1 waiting.
      With two rounds of micro-batches or more (m >= 2 p) every other stage has run a weight pass
      since its last input pass there: w = v - 1. With one round a stage's next input pass (the
      next micro-batch's) comes before its weight pass: weight gradients wait only once a stage's
      backwards are done, while the activations fall -- with k stages done (k = 1 .. v - 1) the
      rank holds p - i + (k - 1) g fewer stage-micro-batches (g = m). Rank 0 peaks either in an
      input pass of a later stage (1 waiting, the first stage not among w) or in the first
      stage's weight pass (none waiting, every other stage's weight gradients);
    - V: either all 2 p stage-micro-batches with one waiting and the other stage's weight
      gradients (rank 0: one waiting, or the other stage's weight gradients in the first stage's
      weight pass, there with one stage-micro-batch fewer when m = 2 p - 1), or, on the later
      ranks, p + i with 2 i + 1 waiting and none (the V's second stage runs its input passes
      ahead of its weight passes), or 2 i - 1 with as many waiting and the first stage's weight
      gradients (ranks i >= 2, as the second stage's backwards end). Exact from 2 p - 1
      micro-batches on (the number torch plans the V for); with fewer, torch drops the missing ones
      from the plan and the peak is lower: this is an upper bound there, and
      :func:`zero_bubble_moments` replays the order instead.
    """
    held = chunks_in_flight("zero-bubble", pp, v, m, rank, style)
    if style == "v":
        if rank == 0:
            return ((held, 1, 0), (held - (m == 2 * pp - 1), 0, 1))
        late = min(pp + rank, held)
        candidates = [(late, min(2 * rank + 1, late), 0), (held, 1, 1)]
        if rank >= 2:
            candidates.append((2 * rank - 1, 2 * rank - 1, 1))
        return tuple(candidates)
    waiting = 1 if rank == 0 else min(rank + 1, held)
    if v == 1:
        return ((held, 0 if rank == 0 else waiting, 0),)
    if interleaved_rounds(m, pp) > 1:
        if rank == 0:
            return ((held, waiting, v - 2), (held, 0, v - 1))
        return ((held, waiting, v - 1),)
    candidates = [(held, waiting, 0)]
    for k in range(1, v):
        last = rank == 0 and k == v - 1  # the first stage's weight pass
        candidates.append((held - (pp - rank) - (k - 1) * m, 0 if last else waiting, k))
    return tuple(candidates)


class ZeroBubbleMoment(NamedTuple):
    """A moment a zero-bubble rank's peak can be at, with what FSDP2 keeps of its stages' gradients
    there (:func:`zero_bubble_moments`)."""

    held: int
    """Stage-micro-batches holding activations."""
    waiting: int
    """Of them, those whose output gradients wait for the weight pass."""
    weights: int
    """Other stages of the rank whose weight gradients wait for their next input pass."""
    first_waits: int = 0
    """Of those, the ones waiting for the first time in the step: FSDP2 makes a unit's fp32
    accumulated gradients in the first input pass after its first weight pass
    (``to_accumulated_grad_if_needed``), so these have none yet."""
    running_grads: bool = True
    """Whether the running stage holds weight gradients in compute precision of its own."""
    weight_pass: bool = False
    """Whether the moment is in the running stage's weight pass, whose parameter group's new
    gradients exist beside ``.grad`` until added to it (``stage_backward_weight``)."""
    input_pass: bool = False
    """Whether the moment is at the start of the running stage's input pass, its gradients from
    the weight pass before still in compute precision beside its fp32 accumulation, until the
    pass's post-backward hook adds them into it."""
    accumulations: int | None = None
    """Stages of the rank holding an fp32 accumulation; None: every stage but ``first_waits``.
    With one round of micro-batches a stage makes it only in its backward (see ``reduced``)."""
    reduced: int = 0
    """Stages whose last weight pass of the step is done: torch's ``REDUCE_GRAD`` right after it
    reduce-scattered their gradients (the sharded ones now exist, the unsharded are gone) and
    resharded their parameters (``perform_reduce_grad``)."""
    running: int | None = None
    """Where the running stage comes in the order the rank's stages finish their backwards (0 the
    first: the looped rank's last stage, ZB-V's second); None: at ``reduced``, after those done.
    The stages before it in that order are the ``reduced`` ones, then those of ``accumulations``."""


def zero_bubble_moments(
    pp: int, v: int, m: int, rank: int, style: StageStyle = "looped", weights_wait: bool = True
) -> tuple[ZeroBubbleMoment, ...]:
    """:func:`zero_bubble_peaks`' placements with what FSDP2 keeps of the gradients at each.

    With one round of micro-batches (looped, m < 2 p) the rank's stages run their backwards one
    after another and hold gradients accordingly (:func:`_one_round_moments`); so do ZB-V's with
    fewer micro-batches than the V is planned for (m < 2 p - 1, :func:`_v_short_moments`). Elsewhere but one
    case, at the placement every other stage waiting has been added into its fp32 accumulation
    before and the running stage holds gradients of its own (its previous weight passes', or the
    block running backward). The exception is the last rank with two
    rounds of micro-batches (m = 2 p): each of its stages runs a round's input passes before that
    round's weight passes, so at the activations' peak -- the last stage's input passes of the
    second round, and the first weight pass that follows -- the other stages' weight gradients
    wait for the *first* time (no fp32 accumulation yet: it comes with their next input pass) and
    the last stage's were added at the round's first input pass, the weight pass's new ones its
    only. Once the other stages' first input pass of the second round has made their
    accumulation, the last stage runs its next weight pass, one stage-micro-batch fewer held, its
    earlier weight pass's gradients beside the new ones, the first stages (v > 2) still waiting
    for the first time (read off torch's order, tests/test_stages.py). ``planc verify
    --simulate``, PP 4 x DP 2, v = 2, 8 micro-batches: the last rank peaks there (7W5), 97.5 MiB,
    against 88.2 in the weight pass at the activations' peak (7W4).

    ``weights_wait``: whether a weight pass's gradients wait in compute precision for the stage's
    next input pass (FSDP2 in mixed precision). In fp32 the weight pass writes into the stage's
    accumulation itself: a stage accumulates from its first weight pass on, the running one's
    included, and nothing waits apart (:func:`_accumulating_from_the_weight_pass`).
    """
    if style == "v" and m < 2 * pp - 1:
        return _v_short_moments(pp, m, rank, weights_wait)
    if style == "looped" and interleaved_rounds(m, pp) == 1:
        moments = _one_round_moments(pp, v, m, rank)
    elif style == "v" or v == 1 or rank != pp - 1 or rank == 0 or interleaved_rounds(m, pp) != 2:
        moments = tuple(ZeroBubbleMoment(*t) for t in zero_bubble_peaks(pp, v, m, rank, style))
    else:
        ((held, waiting, weights),) = zero_bubble_peaks(pp, v, m, rank, style)
        moments = (
            ZeroBubbleMoment(held, waiting, weights, first_waits=weights, running_grads=False, weight_pass=True),
            ZeroBubbleMoment(held - 1, waiting, v - 2, first_waits=v - 2, weight_pass=True),
        )
    return moments if weights_wait else tuple(_accumulating_from_the_weight_pass(c) for c in moments)


def _accumulating_from_the_weight_pass(moment: ZeroBubbleMoment) -> ZeroBubbleMoment:
    """``moment`` where a weight pass writes into its stage's fp32 accumulation itself: no stage
    waits for the first time, the running one accumulates from its first weight pass (looped, one
    round: the only one accumulating), and it holds no gradients of its own apart. Simulated, PP 2
    x ZeRO-2 x DP 2, v = 2, 2 micro-batches (fp32): +10.8 / +10.4 % with every stage's accumulation."""
    accumulations = None if moment.accumulations is None else 1
    return moment._replace(first_waits=0, running_grads=False, accumulations=accumulations)


def _one_round_moments(pp: int, v: int, m: int, rank: int) -> tuple[ZeroBubbleMoment, ...]:
    """:func:`zero_bubble_moments` of a looped rank with one round of micro-batches (p <= m < 2 p).

    Read off torch's order (tests/test_stages.py checks every legal p <= 8, v <= 4): the rank runs
    its stages' weight passes one stage after another, its last stage first, each stage's m of
    them before the next stage's first (its input passes may come earlier: they find no
    gradient). So while the j-th of them runs (j = 0 the last stage), the j before it are done and
    reduced (torch's ``REDUCE_GRAD`` follows a stage's last weight pass), the v - 1 - j after it
    have no gradient at all, and the running stage has made its fp32 accumulation only if an input
    pass came after its first weight pass. At its n-th weight pass (n = 0 .. m - 1) the rank
    holds (v - 1) m + p - max(0, n - (m - p)) stage-micro-batches for j = 0 (its forwards end at
    the (m - p)-th) and (v - j) m - n after; output gradients wait for i + 1 of them (the first
    stage: min(i + 1, m - n), none on rank 0); an input pass precedes every weight pass from the
    first to the (m - i - 1)-th, so the accumulation exists from n = 1 if m - i >= 2, and from
    n = m - i each weight pass finds the previous one's gradients in compute precision. The
    peak is at one of the points where that changes: n = 0, 1 or m - i of some stage -- or at the
    start of the input pass before its second weight pass (m - i >= 3), which holds as many
    stage-micro-batches and finds the first weight pass's gradients beside the accumulation
    (more than a parameter group's new ones).

    The usual count (every stage's accumulation held, the other stages' weight gradients waiting
    from the rank's peak on) is that of two rounds: ``planc verify --simulate``, PP 4 x DP 2, v = 2,
    4 micro-batches, read it 18-41% above, the last rank most (with m = p all of its input passes
    come before its weight passes: no accumulation is ever made).
    """
    moments = []
    for j in range(v):
        first = j == v - 1
        for n in sorted({0, 1, max(1, m - rank)} & set(range(m))):
            held = (v - 1) * m + pp - max(0, n - (m - pp)) if j == 0 else (v - j) * m - n
            waiting = _one_round_waiting(rank, m, n, first)
            moments.append(
                ZeroBubbleMoment(
                    held,
                    waiting,
                    0,
                    running_grads=n >= max(1, m - rank),
                    weight_pass=True,
                    accumulations=int(n >= 1 and m - rank >= 2),
                    reduced=j,
                )
            )
        if m - rank >= 3 and not (first and rank == 0):  # the input pass before the second weight pass
            held = (v - 1) * m + pp - max(0, 2 - (m - pp)) if j == 0 else (v - j) * m - 2
            waiting = _one_round_waiting(rank, m, 2, first)
            moments.append(ZeroBubbleMoment(held, waiting, 0, input_pass=True, accumulations=1, reduced=j))
    return tuple(moments)


def _v_short_moments(pp: int, m: int, rank: int, weights_wait: bool = True) -> tuple[ZeroBubbleMoment, ...]:
    """:func:`zero_bubble_moments` of a ZB-V rank with fewer micro-batches than torch plans the V
    for (m < 2 p - 1): the moment at the start of each of the rank's backward passes in
    :func:`zbv_order`, replayed with FSDP2's rules -- a stage's weight pass leaves its gradients in
    compute precision until the stage's next input pass, whose post-backward hook makes (the first
    time) or adds into its fp32 accumulation; the first stage's input pass does nothing and its
    weight pass is its whole backward, hook included; after a stage's m-th weight pass torch
    reduces it (``REDUCE_GRAD``). A forward's moment is never higher than the pass after it
    (tests/test_stages.py checks the largest against torch's own order for every legal p and m).

    With the micro-batches torch drops, the V's second stage runs most of its backwards, its
    input and weight passes in turn, before the first stage's begin, and the cool-down that
    interleaves the two is cut short by a different amount on each rank: a replay, not a closed
    form. The second stage accumulates first and is reduced first (the head's on rank 0, the
    embedding's stage last: :class:`ZeroBubbleMoment`'s ``running`` order), and the later a rank,
    the more its two stages' accumulations overlap. ``planc verify --simulate``, PP 4 x DP 2, 4
    micro-batches: rank 0 peaks in the head stage's input pass 7I3 (5 stage-micro-batches, stage
    7's accumulation and 7W2's gradients beside it, nothing of stage 0) and rank 2 in 2W1 (both
    accumulations, stage 5's gradients waiting), where the usual count held both accumulations
    and the other stage's waiting gradients on every rank (+22.8% and +3.8%; now -0.6% and +0.3%).
    Without ``weights_wait`` (fp32) every weight pass writes into its stage's accumulation, the
    running one's counted from its first.
    """
    first, second = stages_of_rank(rank, pp, 2, "v")
    order = {second: 0, first: 1}
    alive: set[tuple[int, int]] = set()
    waiting: set[tuple[int, int]] = set()
    pending: set[int] = set()  # weight gradients in compute precision
    accumulated: set[int] = set()
    reduced: set[int] = set()
    passes = {first: 0, second: 0}
    moments: dict[ZeroBubbleMoment, None] = {}
    for kind, stage, micro_batch in zbv_order(pp, m, rank):
        key = (stage, micro_batch)
        if kind == "F":
            alive.add(key)
            continue
        if kind == "B" and stage == 0:  # the first stage has no input pass
            continue
        if kind == "B":
            waiting.add(key)
        others = pending - {stage}
        moment = ZeroBubbleMoment(
            len(alive),
            len(waiting),
            len(others),
            first_waits=len(others - accumulated),
            running_grads=stage in pending,
            weight_pass=kind == "W",
            input_pass=kind == "B",
            accumulations=len(accumulated if weights_wait or kind == "B" else accumulated | {stage}),
            reduced=len(reduced),
            running=order[stage],
        )
        moments[moment] = None
        if kind == "B":
            if stage in pending:
                accumulated.add(stage)
            pending.discard(stage)
            continue
        alive.discard(key)
        waiting.discard(key)
        (accumulated if stage == 0 or not weights_wait else pending).add(stage)
        passes[stage] += 1
        if passes[stage] == m:
            reduced.add(stage)
            pending.discard(stage)
            accumulated.discard(stage)
    return tuple(moments)


def _one_round_waiting(rank: int, m: int, n: int, first: bool) -> int:
    """Stage-micro-batches whose output gradients wait at rank ``rank``'s n-th weight pass of a
    stage with one round (:func:`_one_round_moments`): i + 1, fewer as the rank's first stage runs
    out of micro-batches, none on the model's first stage (it has no input pass)."""
    if not first:
        return rank + 1
    return 0 if rank == 0 else min(rank + 1, m - n)
