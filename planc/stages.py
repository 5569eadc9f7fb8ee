"""Pipeline stage arithmetic: the one definition of how a model is cut into stages, which rank
holds which stage, and how many micro-batches a rank holds in flight.

A layout with ``pp`` ranks and ``v`` virtual stages cuts the ``layers`` transformer blocks into
``pp x v`` contiguous *stages* (chunks), stage 0 holding the token embedding and stage
``pp v - 1`` the final norm, the output head and the loss. Everything that needs to know where a
block, the embedding or the head lives asks this module: the spec checks and the planner (through
:mod:`planc.legality`), the cost model (parameters and activations per rank, the bubble), the
``pipeline`` strategy (the split the program runs, the schedule) and ``planc explain``'s timeline.

Two placements exist (torch ``generate_stage_to_rank_mapping``):

- **looped** (every schedule but ZBV): rank ``r`` holds stages ``r, r + pp, r + 2 pp, ...``
  (Narayanan et al. 2021, Sec. 2.2.2), so the embedding sits on rank 0 and the head on rank
  ``pp - 1``;
- **v** (``ScheduleZBVZeroBubble``, two stages per rank): rank ``r`` holds stages ``r`` and
  ``2 pp - 1 - r`` (Qi et al. 2023, Sec. 6), so rank 0 holds both the embedding *and* the head.

Pure integer arithmetic; no torch, no pydantic.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

StageStyle = Literal["looped", "v"]
#: The zero-bubble schedules the ``pipeline`` strategy can run (its ``zero_bubble`` option).
ZeroBubbleVariant = Literal["interleaved", "zbv"]


# -- cutting the model ---------------------------------------------------------------------------


def chunk_layer_counts(layers: int, chunks: int) -> tuple[int, ...]:
    """Blocks in each of ``chunks`` contiguous stages, as even as possible; the first
    ``layers % chunks`` take one more.

    The last stage also runs the output projection and the loss, so the extra blocks of an
    uneven split go to the front (10 layers in 4 stages: 3, 3, 2, 2).

    >>> chunk_layer_counts(10, 4)
    (3, 3, 2, 2)
    """
    if not 1 <= chunks <= layers:
        raise ValueError(f"cannot cut {layers} layers into {chunks} non-empty pipeline stages")
    base, extra = divmod(layers, chunks)
    return tuple(base + (1 if c < extra else 0) for c in range(chunks))


def layer_ranges(layers: int, chunks: int) -> list[range]:
    """The block indices of each stage (:func:`chunk_layer_counts` as ranges).

    >>> layer_ranges(10, 4)
    [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    """
    ranges, start = [], 0
    for size in chunk_layer_counts(layers, chunks):
        ranges.append(range(start, start + size))
        start += size
    return ranges


# -- placing stages on ranks ---------------------------------------------------------------------


def stage_style(schedule: str | None, zero_bubble: ZeroBubbleVariant = "interleaved") -> StageStyle:
    """The placement a schedule runs with: V-shaped only for ZBV (``schedule = zero-bubble`` with the
    ``pipeline`` option ``zero_bubble = "zbv"``), looped for everything else."""
    return "v" if schedule == "zero-bubble" and zero_bubble == "zbv" else "looped"


def stages_of_rank(rank: int, pp: int, v: int, style: StageStyle = "looped") -> tuple[int, ...]:
    """The stages pipeline rank ``rank`` holds, in the order it runs them.

    >>> stages_of_rank(1, 4, 2)
    (1, 5)
    >>> stages_of_rank(1, 4, 2, "v")
    (1, 6)
    """
    if not 0 <= rank < pp:
        raise ValueError(f"pipeline rank {rank} outside 0 .. {pp - 1}")
    if style == "v":
        if v != 2:
            raise ValueError(f"the V placement holds exactly 2 stages per rank, not {v}")
        return (rank, 2 * pp - 1 - rank)
    return tuple(rank + k * pp for k in range(v))


def rank_of_stage(stage: int, pp: int, v: int, style: StageStyle = "looped") -> int:
    """The pipeline rank that holds ``stage``.

    >>> rank_of_stage(7, 4, 2), rank_of_stage(7, 4, 2, "v")
    (3, 0)
    """
    if not 0 <= stage < pp * v:
        raise ValueError(f"stage {stage} outside 0 .. {pp * v - 1}")
    if style == "v":
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def rank_layer_counts(layers: int, pp: int, v: int = 1, style: StageStyle = "looped") -> tuple[int, ...]:
    """Blocks held by each pipeline rank (the sum of its stages).

    >>> rank_layer_counts(10, 4)
    (3, 3, 2, 2)
    >>> rank_layer_counts(10, 2, 2)   # stages (3, 3, 2, 2): rank 0 holds stages 0 and 2
    (5, 5)
    """
    counts = chunk_layer_counts(layers, pp * v)
    return tuple(sum(counts[s] for s in stages_of_rank(r, pp, v, style)) for r in range(pp))


def holds_embedding(rank: int, pp: int, v: int, style: StageStyle = "looped") -> bool:
    """Whether ``rank`` holds stage 0 (the token and position embeddings)."""
    return rank_of_stage(0, pp, v, style) == rank


def holds_head(rank: int, pp: int, v: int, style: StageStyle = "looped") -> bool:
    """Whether ``rank`` holds the last stage (final norm, output head, logits and loss)."""
    return rank_of_stage(pp * v - 1, pp, v, style) == rank


def holds_turn(rank: int, pp: int, style: StageStyle = "looped") -> bool:
    """Whether ``rank`` holds ZB-V's turn: stages p - 1 and p, one feeding the other on the rank,
    so their activations and gradients pass between them without a send."""
    return style == "v" and rank_of_stage(pp - 1, pp, 2, style) == rank == rank_of_stage(pp, pp, 2, style)


def busiest_rank_pair_boundaries(pp: int, v: int, style: StageStyle = "looped") -> int:
    """Stage boundaries (stage s feeding stage s + 1) between the pair of pipeline ranks that
    shares the most: each carries every micro-batch's activation one way and its gradient back.

    Looped: rank i feeds rank i + 1 at v boundaries and the last rank feeds rank 0 at v - 1 (the
    wrap to the next round of chunks); with pp = 2 both are the same pair, 2 v - 1 boundaries
    (torch's ``ScheduleInterleaved1F1B``, pp 2, v 2: rank 0 sends 64 activations and 32 gradients
    of 32 micro-batches, and receives 32 and 64). V: rank i and i + 1 meet twice, once on each
    leg; the turn stays on its rank.

    >>> busiest_rank_pair_boundaries(4, 2), busiest_rank_pair_boundaries(2, 2), busiest_rank_pair_boundaries(2, 1)
    (2, 3, 1)
    >>> busiest_rank_pair_boundaries(2, 2, "v")
    2
    """
    shared: dict[frozenset[int], int] = {}
    for s in range(pp * v - 1):
        pair = frozenset((rank_of_stage(s, pp, v, style), rank_of_stage(s + 1, pp, v, style)))
        if len(pair) == 2:
            shared[pair] = shared.get(pair, 0) + 1
    return max(shared.values(), default=0)


def representative_ranks(pp: int, style: StageStyle = "looped") -> tuple[int, ...]:
    """Pipeline ranks whose memory and time bound all others.

    Looped: first, second, last. Rank 0 has the most blocks (the extra ones go to the front), the
    embedding and the most micro-batches in flight; the last rank has the head and the logits;
    rank 1 is the first to hold both activation and gradient receive buffers. Ranks 2 .. pp-2
    hold no more than rank 1. V: every rank. Rank 0 holds the embedding, the head and the most
    blocks, the last rank the middle of the model, whose two stages meet there; the others hold as
    many blocks and buffers, but torch's order differs from rank to rank: with fewer micro-batches
    than the V is planned for (:func:`zero_bubble_moments`) a later rank's two stages overlap
    their backwards more, and its gradients peak higher (``planc verify --simulate``, PP 4 x DP 2,
    4 micro-batches: rank 2 89.3 MiB, rank 1 78.2).
    """
    if style == "v":
        return tuple(range(pp))
    return tuple(sorted({0, min(1, pp - 1), pp - 1}))


# -- micro-batches -------------------------------------------------------------------------------


def micro_batches(global_batch: int, dp: int, micro_batch: int) -> int:
    """Micro-batches per optimizer step on one data-parallel rank (a schedule's ``n_microbatches``)."""
    return global_batch // (dp * micro_batch)


def interleaved_rounds(m: int, pp: int) -> int:
    """How many rounds torch's interleaved schedules run ``m`` micro-batches in: ``max(1, m // pp)``,
    each of ``m / rounds`` micro-batches (so ``m`` must be a multiple of the rounds)."""
    return max(1, m // pp)


def chunks_in_flight(schedule: str | None, pp: int, v: int, m: int, rank: int, style: StageStyle = "looped") -> int:
    """Stage-micro-batches whose activations pipeline rank ``rank`` holds at its peak.

    - no pipeline: 1 (gradient accumulation runs micro-batches one after another);
    - GPipe (Huang et al. 2019): all m forwards before any backward: m;
    - 1F1B (Narayanan et al. 2021, Sec. 2.2.1; torch ``Schedule1F1B``): rank i warms up with
      p - i forwards: min(p - i, m);
    - interleaved (Sec. 2.2.2; torch ``ScheduleInterleaved1F1B``): micro-batches go in rounds
      of g = m / :func:`interleaved_rounds` (g = p when p divides m); rank i warms up with
      (v - 1) g + 2 (p - 1 - i) stage forwards, one more in flight: capped at v m. On rank 0 with
      g = p this is v p + p - 1 stages of L/(p v) layers, i.e. Korthikanti's L (1 + (p - 1)/(p v));
    - zero-bubble, looped (Qi et al. 2023, ZB-H1; torch ``ScheduleInterleavedZeroBubble``): a
      stage-micro-batch's activations live from its forward until its weight-gradient pass, not
      its input-gradient pass (torch keeps the graph between the two halves, ``retain_graph``):
      rank i warms up with (v - 1) g + (p - 1 - i) forwards, one more in flight, and holds i
      more whose weight gradients wait, so every rank holds (v - 1) g + p, capped at v m (v p with
      g = p). Equal to the replay of torch's own order for every legal p <= 8, v <= 4, m
      (tests/test_stages.py). Counting only to the input-gradient pass (v p - i) had the last stage
      of a Llama 3 70B plan (TP 8 x PP 4, v = 2) 40% above the prediction in ``planc verify --simulate``;
    - zero-bubble, V (ZB-V, Qi et al. 2023, Sec. 6; torch ``ScheduleZBVZeroBubble``): before its
      first backward, rank i runs 2 (p - i) - 1 + i forwards of its first stage and i + 1 of its
      second, each capped at the m micro-batches that exist: with m >= 2p - 1, 2 p stages on every
      rank, the activations of p micro-batches of L/p layers, as 1F1B's rank 0.

    :mod:`planc.explain.timeline` replays each schedule; a test checks these counts against it,
    and the zero-bubble ones against torch's own operation order.
    """
    if pp == 1 or schedule is None:
        return 1
    if schedule == "gpipe":
        return m * v
    if schedule == "1f1b":
        return min(pp - rank, m)
    per_round = m // interleaved_rounds(m, pp)
    if schedule == "interleaved":
        return min((v - 1) * per_round + 2 * (pp - 1 - rank) + 1, v * m)
    if schedule == "zero-bubble":
        if style == "v":
            return min(2 * pp - rank - 1, m) + min(rank + 1, m)
        return min((v - 1) * per_round + pp, v * m)
    raise ValueError(f"unknown schedule {schedule!r}")


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
    pp: int, v: int, m: int, rank: int, style: StageStyle = "looped"
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
    """
    if style == "looped" and interleaved_rounds(m, pp) == 1:
        return _one_round_moments(pp, v, m, rank)
    if style == "v" and m < 2 * pp - 1:
        return _v_short_moments(pp, m, rank)
    triples = zero_bubble_peaks(pp, v, m, rank, style)
    if style == "v" or v == 1 or rank != pp - 1 or rank == 0 or interleaved_rounds(m, pp) != 2:
        return tuple(ZeroBubbleMoment(*t) for t in triples)
    ((held, waiting, weights),) = triples
    return (
        ZeroBubbleMoment(held, waiting, weights, first_waits=weights, running_grads=False, weight_pass=True),
        ZeroBubbleMoment(held - 1, waiting, v - 2, first_waits=v - 2, weight_pass=True),
    )


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


def _v_short_moments(pp: int, m: int, rank: int) -> tuple[ZeroBubbleMoment, ...]:
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
            accumulations=len(accumulated),
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
        (accumulated if stage == 0 else pending).add(stage)
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


def flush_bubble_slots(pp: int, v: int, m: int) -> float:
    """Idle micro-batch slots of a pipeline flush: (p - 1)/v once m >= p (Narayanan et al. 2021,
    Sec. 2.2: bubble fraction (p - 1)/(v m)).

    In stage time (a slot / v) the step lasts v m + p - 1 stages when m >= p: the last
    micro-batch leaves p - 1 stage-hops after the first rank is done. With fewer micro-batches
    than stages a micro-batch's own path (p v stages) is the critical one: v p + m - 1. Both are
    v max(m, p) + min(m, p) - 1; the bubble is that less the v m stages of work.
    """
    return (v * max(m, pp) + min(m, pp) - 1) / v - m


def bubble_slots(
    schedule: str | None,
    pp: int,
    v: int,
    m: int,
    *,
    forward: float = 1.0,
    backward: float = 2.0,
    backward_weight: float = 1.0,
    style: StageStyle = "looped",
) -> float:
    """Idle micro-batch slots per step of ``schedule`` (a slot: one micro-batch's forward + backward).

    GPipe, 1F1B and interleaved: :func:`flush_bubble_slots`. Zero-bubble splits each backward
    (``backward`` seconds) into its input-gradient and weight-gradient halves and runs the weight
    half (``backward_weight``) in the idle time: ZB-H1's bubble is (p - 1)(T_F + T_B - T_W) for
    1F1B's (p - 1)(T_F + T_B + T_W) (Qi et al. 2023, Sec. 2.1, Fig. 3; their T_B is the
    input-gradient half alone), i.e. the flush bubble times (f + b - 2 w)/(f + b) with b the whole
    backward -- a third of it when the three passes take equal time. ZB-V (``style = "v"``)
    leaves the same bubble as ZB-H1 with v = 2, except that torch plans it for 2p - 1
    micro-batches and drops the missing ones: with m < 2p - 1 each missing micro-batch leaves
    rank 0 idle for its two forwards (2 f).
    """
    if pp == 1 or schedule is None:
        return 0.0
    slots = flush_bubble_slots(pp, v, m)
    if schedule != "zero-bubble":
        return slots
    slots *= max(0.0, forward + backward - 2 * backward_weight) / (forward + backward)
    if style == "v":
        slots = max(slots, (2 * pp - 1 - m) * 2 * forward / (v * (forward + backward)))
    return slots
