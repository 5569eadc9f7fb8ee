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

from functools import lru_cache
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


@lru_cache(maxsize=1024)  # the planner asks for every pipeline layout it scores
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


def rank_boundaries(rank: int, pp: int, v: int, style: StageStyle = "looped") -> int:
    """Stage boundaries that cross from pipeline rank ``rank`` to another rank: each carries every
    micro-batch's activation one way and its gradient back, sent or received by ``rank``. A middle
    rank of a plain pipeline crosses two (one to each neighbour), the first and the last rank one:
    a middle rank moves twice what the busiest pair of ranks shares
    (:func:`busiest_rank_pair_boundaries`), over two links.

    >>> [rank_boundaries(r, 4, 1) for r in range(4)], [rank_boundaries(r, 2, 2) for r in range(2)]
    ([1, 2, 2, 1], [3, 3])
    >>> [rank_boundaries(r, 2, 2, "v") for r in range(2)]
    [2, 2]
    """
    crossing = 0
    for stage in stages_of_rank(rank, pp, v, style):
        for neighbour in (stage - 1, stage + 1):
            if 0 <= neighbour < pp * v and rank_of_stage(neighbour, pp, v, style) != rank:
                crossing += 1
    return crossing


def representative_ranks(pp: int, style: StageStyle = "looped") -> tuple[int, ...]:
    """Pipeline ranks whose memory and time bound all others.

    Looped: first, second, last. Rank 0 has the most blocks (the extra ones go to the front), the
    embedding and the most micro-batches in flight; the last rank has the head and the logits;
    rank 1 is the first to hold both activation and gradient receive buffers. Ranks 2 .. pp-2
    hold no more than rank 1. V: every rank. Rank 0 holds the embedding, the head and the most
    blocks, the last rank the middle of the model, whose two stages meet there; the others hold as
    many blocks and buffers, but torch's order differs from rank to rank: with fewer micro-batches
    than the V is planned for (:func:`planc.zero_bubble.zero_bubble_moments`) a later rank's two
    stages overlap their backwards more, and its gradients peak higher (``planc verify
    --simulate``, PP 4 x DP 2, 4 micro-batches: rank 2 89.3 MiB, rank 1 78.2).
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


def backwards_stage_by_stage(schedule: str | None, pp: int, m: int) -> bool:
    """Whether a rank runs its stages' backwards one stage after another, each stage's m before the
    next stage's first: the interleaved schedule with one round of micro-batches (m < 2 p), whose
    steady phase ends within the rank's last stage's backwards (:func:`interleaved_peaks`)."""
    return schedule == "interleaved" and interleaved_rounds(m, pp) == 1


class InterleavedMoment(NamedTuple):
    """A moment of an interleaved rank's step where its peak can be, as a backward starts."""

    held: int
    """Stage-micro-batches holding activations."""
    begun: int
    """Of the rank's v stages, those whose backward has begun (they hold gradients)."""
    sends: int
    """Boundary tensors the rank's finished sends still hold (:func:`sends_held`)."""


def interleaved_peaks(pp: int, v: int, m: int, rank: int) -> tuple[InterleavedMoment, ...]:
    """Where an interleaved rank's peak can be, one :class:`InterleavedMoment` per candidate. A
    stage's gradients exist from its first backward of the step (the previous step's
    ``zero_grad`` set them to None) to the optimizer step; the backwards run a round's g
    micro-batches of the rank's last stage, then of the stage before, and so on (torch
    ``ScheduleInterleaved1F1B``); every backward leaves up to two boundary tensors held by its
    sends (:func:`sends_held`), so of a phase that holds the same activations its end counts.

    With two rounds or more (m >= 2 p) the steady 1F1B phase, which holds
    :func:`chunks_in_flight`, lasts past every stage's first backward: its end, after the last
    forward, (in flight, v). With one round (p <= m < 2 p) it ends within the last stage's
    backwards: that stage alone has gradients while the activations peak; the stage before begins
    its backwards once the last stage's m are done, with (v - 1) m held, and so on -- (v - j) m
    held where j + 1 stages have begun. Both end with the step's last backward: one held, every
    stage begun, the most sends. Which is highest depends on the sizes of a stage-micro-batch's
    activations, a stage's gradients and a boundary tensor. The largest of a x held + g x begun
    + c x sends over these moments equals that over torch's own order replayed, for every legal
    p <= 8, v <= 4 and m (tests/test_interleaved_gradients.py). PP 2 x DP 2, v = 2, 2
    micro-batches (``planc verify --simulate``): the second rank peaked with its last stage's fp32
    gradients alone, 0.88 of the 1.64 MiB that counting every stage's priced (+9.7 %)."""
    in_flight = chunks_in_flight("interleaved", pp, v, m, rank)

    def moment(held: int, begun: int) -> InterleavedMoment:  # every forward has run
        return InterleavedMoment(held, begun, sends_held(pp, v, m, rank, v * m - held))

    if not backwards_stage_by_stage("interleaved", pp, m):
        return (moment(in_flight, v), moment(1, v))
    return (moment(in_flight, 1), *(moment((v - j) * m, j + 1) for j in range(1, v)), moment(1, v))


def sends_held(pp: int, v: int, m: int, rank: int, backwards: int) -> int:
    """Boundary tensors a looped rank's sends hold once it has run ``backwards`` stage backwards.

    torch's runtime schedules (``_PipelineScheduleRuntime``: interleaved 1F1B and the zero-bubble
    ones) keep every send's work, and the work the tensor it sends, until the step's end ("send
    ops should be waited on before step() exits"): a stage's output outlives its backward, which
    would free it, and each backward's input gradient, sent to the stage before, outlives the
    send. The model's last stage (the rank pp - 1's last) sends no output, its first (rank 0's
    first) no gradient. Measured on CPU processes (gloo), tiny model, PP 2, v = 2: the second
    rank held 5 input gradients and 2 outputs more than ``planc verify --simulate`` (the ``fake``
    process group drops a tensor as it sends it) at its peak; with 16 micro-batches the
    prediction without them was 16 % low."""
    sent = 2 * backwards
    if rank == pp - 1:
        sent -= _backwards_of_stage(v - 1, pp, v, m, backwards)
    if rank == 0:
        sent -= _backwards_of_stage(0, pp, v, m, backwards)
    return sent


def _backwards_of_stage(local: int, pp: int, v: int, m: int, backwards: int) -> int:
    """Of a rank's first ``backwards`` stage backwards, those of its stage ``local`` (0 first): each
    round runs its g micro-batches on the last stage, then on the one before, and so on."""
    g = m // interleaved_rounds(m, pp)
    rounds, rest = divmod(backwards, g * v)
    return rounds * g + min(g, max(0, rest - (v - 1 - local) * g))


def freed_before_the_first_stage_backward(schedule: str | None, pp: int, m: int, held: float) -> float:
    """Stage-micro-batches whose backward has run between rank 0's peak, ``held`` of them, and its
    first backward of the model's first stage (the embedding's): with one round of interleaved
    micro-batches the rank's later stages run all theirs first, leaving the first stage's m
    (:func:`interleaved_peaks`): held - m; elsewhere none (that backward starts in the steady
    phase, or the first stage is the rank's only one, its peak's own backward)."""
    return max(0.0, held - m) if backwards_stage_by_stage(schedule, pp, m) else 0.0


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
