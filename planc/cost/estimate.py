"""The :class:`Estimate`: what one layout costs, as named parts that cost passes add to.

An estimate is an immutable value. The core builds the terms every program has (model states,
one micro-batch of activations, compute, the optimizer step); then each active strategy's
``cost(ctx, estimate, options)`` returns a new estimate with its own terms added or changed
(pipeline: micro-batches in flight, bubble, p2p; data parallel: sharding and gradient traffic;
a third-party plugin: anything, e.g. scaling the ``dp`` traffic or moving optimizer states off
the device). Use the ``with_*`` helpers; never mutate.

Memory is kept per representative pipeline rank (:class:`StageMemory`): the worst one is the
device's requirement. Time is per optimizer step on the slowest rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from planc.cost.comm_cost import CommCost as CommCost  # re-exported: plugins import it from here
from planc.cost.frozen import replace
from planc.stages import StageStyle
from planc.zero_bubble import ZeroBubbleMoment

#: :attr:`Term.phase` of seconds of host work in every micro-batch's forward and backward on the
#: slowest stage, which a pipeline's bubble waits for too (:meth:`Estimate.slot_seconds`).
PER_MICRO_BATCH = "each micro-batch"


class Term(NamedTuple):
    """A named amount (bytes or seconds) that explain can show on its own line."""

    name: str
    value: float
    phase: str = ""
    """For memory: the phase of the step that holds these bytes ("loss", "backward"), or "" for
    bytes held throughout. A stage's peak counts only the largest phase (see :class:`StageMemory`).
    Bytes held through several phases name them all, joined by :data:`PHASES_JOINED`
    ("forward, loss, head backward"). For seconds: :data:`PER_MICRO_BATCH` or "" (once per step)."""

    held: str = ""
    """For memory, where the phases recur across micro-batches: "" in each of them;
    :data:`FROM_FIRST_BACKWARD` only from the step's first backward on (what a backward makes and
    the step keeps: accumulated gradients); :data:`UNTIL_LATER_LOSS` only until a later
    micro-batch's loss (one of the micro-batches waiting at the first loss, whose backward has run
    by then). Only a stage whose forwards all come first (``StageMemory.first_backward_frees``)
    tells these moments apart; elsewhere every moment follows a backward."""

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases that hold these bytes (none: held throughout)."""
        return tuple(self.phase.split(PHASES_JOINED)) if self.phase else ()

    def held_in(self, phase: str) -> bool:
        """Whether these bytes are held in ``phase`` (untagged bytes are held in every one)."""
        return not self.phase or phase in self.phases


#: How a :class:`Term` held in several phases joins their names.
PHASES_JOINED = ", "
#: :attr:`Term.held`: bytes that exist from the step's first backward on.
FROM_FIRST_BACKWARD = "from the step's first backward on"
#: :attr:`Term.held`: bytes that exist until a later micro-batch's loss.
UNTIL_LATER_LOSS = "until a later micro-batch's loss"
#: Every :attr:`Term.held`, in the order :meth:`StageMemory._peak` sums them.
_HELD_KINDS = ("", FROM_FIRST_BACKWARD, UNTIL_LATER_LOSS)
_NOTHING_HELD = (0.0, 0.0, 0.0)


class _Moment(NamedTuple):
    """A moment of the step the peak can be at (:meth:`StageMemory._moments`)."""

    phase: str
    grads: float
    """Gradient bytes of the model states held."""
    blocks: float
    """Bytes of the blocks' saved activations held."""
    after_backward: bool = True
    """Whether a backward has run in the step (:data:`FROM_FIRST_BACKWARD` terms are held)."""
    later_loss: bool = False
    """Whether a later micro-batch's loss runs (:data:`UNTIL_LATER_LOSS` terms are gone)."""

    def holds(self, term: Term) -> bool:
        """Whether ``term`` is held at this moment."""
        return term.held_in(self.phase) and self.keeps(term.held)

    def keeps(self, held: str) -> bool:
        """Whether bytes whose :attr:`Term.held` is ``held`` exist at this moment (in its phase)."""
        if held == FROM_FIRST_BACKWARD:
            return self.after_backward
        return not (held == UNTIL_LATER_LOSS and self.later_loss)


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Bytes on one device of one pipeline rank."""

    rank: int
    params: float
    """Working copy of the parameters."""
    master: float
    """fp32 master parameters kept besides the working copy."""
    grads: float
    optimizer: float
    """Optimizer states (Adam m and v, SGD momentum)."""
    act_per_layer: float
    """Activation bytes one block keeps per micro-batch (depends on recomputation, TP, SP)."""
    act_layers: float
    """Block-micro-batches held at the peak: blocks on this rank x micro-batches in flight."""
    act_extra: tuple[Term, ...] = ()
    """Other activations: logits and loss, the recompute working set."""
    transient: tuple[Term, ...] = ()
    """Buffers: FSDP gathers, DDP buckets, pipeline receive buffers, runtime, allocator margin."""
    first_backward_frees: float = 0.0
    """Block-micro-batches one micro-batch's backward frees on this rank, where every forward
    whose activations the rank holds at once runs before the rank's first backward of the step
    (GPipe; 1F1B, interleaved and zero-bubble ranks whose forwards all come first; no pipeline
    and one micro-batch): the gradients, set to None by the previous step's ``zero_grad``, do not
    exist yet while the activations peak. 0 where the gradients are held at the peak: a backward
    comes first, or a strategy keeps them between steps (DDP's buckets)."""
    head_grads: float = 0.0
    """Gradient bytes of the output head and final norm on this rank: they exist when its first
    block backward starts (the head's backward comes first)."""
    embedding_grads: float = 0.0
    """Gradient bytes of the token embedding on this rank: its backward comes last, after every
    block's, so they do not exist while a block runs backward in the first micro-batch."""
    stages_without_grads: int = 0
    """Of the rank's stages, those (its first ones, looped) whose first backward of the step comes
    after its peak, so hold no gradient there: an interleaved rank with one round of micro-batches
    (:func:`planc.stages.interleaved_peaks`). Set by the pipeline pass; ``absent_grads`` are their
    bytes of ``grads``; a wrapper that keeps ``accumulated_grads`` takes them off its own."""
    absent_grads: float = 0.0
    """Bytes of ``grads`` that no backward has made by the peak (``stages_without_grads``')."""
    weight_grads_waiting: int = 0
    """Zero-bubble: the rank's stages (other than the one running) whose weight-pass gradients
    wait in compute precision for the stage's next input pass at the peak
    (:func:`planc.zero_bubble.zero_bubble_peaks`); the data-parallel wrapper that keeps them apart
    prices them (:func:`planc.cost.data_parallel.weight_pass_gradient_bytes`)."""
    zero_bubble_moment: ZeroBubbleMoment | None = None
    """Zero-bubble: the moment of the rank's peak (:func:`planc.zero_bubble.zero_bubble_moments`), for
    what the data-parallel wrapper keeps of the gradients there."""
    accumulated_grads: float | None = None
    """Gradient bytes a data-parallel wrapper that reduces once per step keeps from the step's
    first backward on *in place of* ``grads`` (None: ``grads`` is what a backward leaves). FSDP
    under a pipeline accumulates the gradients unsharded in fp32 and reduce-scatters them into
    the sharded ones, which ``grads`` counts, only after the last micro-batch, when the
    activations are gone (``strategies/fsdp/cost_pass.py``, ``_pipelined_buffers``): mid-step no
    sharded gradient exists, so a moment after a backward holds these instead (:meth:`_moments`).
    Counting ``grads`` there and taking them off again in a buffer term printed a negative
    "held" amount where a zero-bubble rank holds no accumulation at its peak."""

    def _peak(self) -> tuple[_Moment, float]:
        """(the moment of the stage's peak, bytes of the terms held there): the moment of the step
        that holds the most.

        Terms tagged with a phase are held only while it runs: the logits and the loss's
        buffers at the start of backward ("loss"); the recompute working set and FSDP's gathered
        block and unsharded gradients while a block runs backward ("backward"); the logits as
        the head writes them, with autocast's cached weight copies and a pipeline's previous
        logits ("forward"); under autocast the output head's backward ("head backward"). Adding
        the maxima of phases that never coincide over-predicted the peak by 1-14% against
        FSDPMemTracker under FakeTensorMode (issue 13: llama3-8b at 8, llama3-70b at 64 devices).

        With ``first_backward_frees`` the gradients depend on the moment too (:meth:`_moments`).
        """
        # Per phase ("" for the untagged terms), bytes by how long they are held: throughout the
        # phase, from the first backward on, until a later loss (_Moment.keeps).
        sums: dict[str, list[float]] = {"": [0.0, 0.0, 0.0]}
        for t in (*self.act_extra, *self.transient):
            kind = _HELD_KINDS.index(t.held)
            for phase in t.phases or ("",):
                sums.setdefault(phase, [0.0, 0.0, 0.0])[kind] += t.value

        def held(m: _Moment) -> float:
            total = 0.0
            for part in (sums[""], sums.get(m.phase, _NOTHING_HELD)) if m.phase else (sums[""],):
                throughout, after_backward, until_later_loss = part
                total += throughout + (after_backward if m.after_backward else 0.0)
                total += 0.0 if m.later_loss else until_later_loss
            return total

        # max keeps the first of equal moments: a tagged phase before the bare ones.
        peak = max(self._moments([p for p in sums if p]), key=lambda m: m.grads + m.blocks + held(m))
        return peak, held(peak)

    def _moments(self, phases: Iterable[str]) -> Iterator[_Moment]:
        """Each moment the peak can be at.

        With ``first_backward_frees`` (every forward the stage holds at once runs before its first
        backward) the gradients, and the terms held :data:`FROM_FIRST_BACKWARD`, exist only after
        a backward: none before the first backward (the untagged moment, "forward", the first
        micro-batch's "loss"); in a backward phase the larger of its start (every activation, the
        head's gradients only) and its last block's backward in the first micro-batch (every
        gradient but the embedding's, that micro-batch's activations freed); then the embedding's
        backward, with no phase's terms (every gradient); in the loss and the head's backward none
        for the first micro-batch, all for a later one if the rank holds one, one micro-batch's
        activations fewer (and at the loss its :data:`UNTIL_LATER_LOSS` terms: the head's backward
        keeps them, as simulated on a 4-layer Llama 3 8B, -0.4% with them and -1.4% without); every gradient in a later
        micro-batch's embedding backward, whose terms count beyond the finished activations. Counting the gradients
        throughout had GPipe's stages of a 4-layer Llama 3 8B 10.9% and 5.5% above ``planc verify
        --simulate``, and the same model run whole with one micro-batch per step 20.5%; counting
        them at the first micro-batch's loss beside every other micro-batch's, a tiny TP 2 x PP 2
        GPipe over FSDP +9% on its last stage, whose peak is the second micro-batch's loss.
        """
        blocks = self.act_per_layer * self.act_layers
        if not self.first_backward_frees:  # the gradients are held throughout
            for phase in (*phases, ""):
                yield _Moment(phase, self._after_backward(self.grads), blocks)
            return
        # After the first micro-batch's backward: every gradient, its activations freed.
        grads, freed = self._after_backward(self.grads), blocks - self.act_per_layer * self.first_backward_frees
        later = self.act_layers > self.first_backward_frees
        for phase in dict.fromkeys((*phases, "backward")):
            if phase in ("forward start", "forward"):  # before any backward
                yield _Moment(phase, 0.0, blocks, after_backward=False)
            elif phase in ("loss", "head backward"):  # the first micro-batch's; a later one's if the rank holds one
                yield _Moment(phase, 0.0, blocks, after_backward=False)
                if later:
                    yield _Moment(phase, grads, freed, later_loss=phase == "loss")
            else:  # a block's backward: the first one (the head's gradients only) to the last (all but the embedding's)
                yield _Moment(phase, self.head_grads, blocks, after_backward=False)
                yield _Moment(phase, self._after_backward(self.grads - self.embedding_grads), freed)
                if phase == "embedding" and later:  # a later micro-batch's, beside the embedding's gradient
                    # whose terms count beyond the finished activations, against every block's
                    yield _Moment(phase, grads, blocks, later_loss=True)
        yield _Moment("", 0.0, blocks, after_backward=False)  # the forward's end
        yield _Moment("", grads, freed)  # the embedding's backward, with no phase's terms of its own

    def _after_backward(self, grads: float) -> float:
        """Gradient bytes held after a backward where the model states' ``grads`` would hold
        ``grads`` of them: the same less the ``absent_grads`` of stages not backwarded yet, or under
        a wrapper that keeps ``accumulated_grads`` in their place, those less what ``grads`` lacks
        (the embedding's before its first backward).

        At the last block's backward of the first micro-batch (``first_backward_frees``) that may
        come to less than nothing -- an accumulation smaller than the embedding's sharded share,
        where a zero-bubble rank holds none yet: none is held. The moment then holds less than the
        same phase's start (every activation, the head's gradients), which comes first and is
        kept by ``max``: the peak does not move."""
        if self.accumulated_grads is None:  # ``grads`` may lack the embedding's, among the absent ones
            return grads - max(0.0, self.absent_grads - (self.grads - grads))
        return max(0.0, grads - self.grads + self.accumulated_grads)

    @property
    def grads_after_backward(self) -> float:
        """Gradient bytes held from the step's first backward on: the accumulation a wrapper keeps
        in place of the model states' gradients, else those."""
        return self.grads if self.accumulated_grads is None else self.accumulated_grads

    @property
    def peak_phase(self) -> str:
        """The phase of the step where the stage's peak is ("" when no phase holds terms of its own)."""
        return self._peak()[0].phase

    def at_peak(self, term: Term) -> bool:
        """Whether ``term`` is held at the stage's peak (every untagged term held throughout is)."""
        return self._peak()[0].holds(term)

    @property
    def grads_at_peak(self) -> float:
        """Gradient bytes held at the peak: ``grads``, or less before the first backward."""
        return self._peak()[0].grads

    @property
    def block_activations(self) -> float:
        """Bytes of the blocks' activations held at the peak."""
        return self._peak()[0].blocks

    @property
    def activations(self) -> float:
        peak = self._peak()[0]
        return peak.blocks + sum(t.value for t in self.act_extra if peak.holds(t))

    @property
    def transient_bytes(self) -> float:
        peak = self._peak()[0]
        return sum(t.value for t in self.transient if peak.holds(t))

    @property
    def model_states(self) -> float:
        """Parameters, master weights, gradients and optimizer states as they persist between steps."""
        return self.params + self.master + self.grads + self.optimizer

    @property
    def model_states_at_peak(self) -> float:
        """The model states held at the peak: the gradients may not exist yet there."""
        return self.params + self.master + self.grads_at_peak + self.optimizer

    @property
    def total(self) -> float:
        peak, held = self._peak()
        return self.params + self.master + self.optimizer + peak.grads + peak.blocks + held

    def updated(
        self, *, transient: tuple[Term, ...] = (), extra: tuple[Term, ...] = (), **fields: object
    ) -> StageMemory:
        """A copy with ``fields`` replaced and ``transient`` / ``extra`` terms appended."""
        if transient:
            fields["transient"] = self.transient + transient
        if extra:
            fields["act_extra"] = self.act_extra + extra
        return replace(self, **fields)

    def with_transient(self, name: str, value: float) -> StageMemory:
        return self.updated(transient=(Term(name, value),))


@dataclass(frozen=True, slots=True)
class Estimate:
    """Memory per device and time per step of one layout."""

    stages: tuple[StageMemory, ...]
    """Memory of the representative pipeline ranks (first, second, last)."""
    compute: float
    """Device compute per step on the slowest rank, recomputation included (seconds)."""
    recompute: float = 0.0
    """Part of ``compute`` spent recomputing activations."""
    bubble_slots: float = 0.0
    """Idle time of the pipeline, in micro-batch slots (set by the pipeline pass)."""
    optimizer: float = 0.0
    """Optimizer step (seconds)."""
    comm: tuple[CommCost, ...] = ()
    other: tuple[Term, ...] = ()
    """Further seconds on the critical path (e.g. a plugin's host transfers)."""
    notes: tuple[str, ...] = ()
    # Set by the core at finalisation:
    micro_batches: int = 1
    capacity: float = 0.0
    world_size: int = 1
    tokens_per_step: int = 0
    model_flops: float = 0.0
    hardware_flops: float = 0.0
    peak: float = 1.0
    bubble: float = 0.0
    """Pipeline bubble in seconds (bubble_slots x the slot time), filled in by finalisation."""
    peak_memory: float = 0.0
    """Bytes of the worst stage, filled in by finalisation (0 before)."""
    stage_style: StageStyle = "looped"
    """Where the pipeline stages sit (:mod:`planc.stages`), as the context placed them."""
    host_bound: bool = False
    """A block's compute is the host's eager dispatch, not its kernels (a GPU with little work per
    block: :attr:`planc.cost.compute.LayerTimes.host_bound`)."""

    # -- helpers for cost passes -----------------------------------------------------------

    def replace(self, **changes: object) -> Estimate:
        return replace(self, **changes)

    def updated(
        self,
        *,
        stage_fn: Callable[[StageMemory], StageMemory] | None = None,
        comm: CommCost | None = None,
        **fields: object,
    ) -> Estimate:
        """One copy with every change a pass makes: ``stage_fn`` applied to each stage's memory,
        ``comm`` added (replacing its group's entry), ``fields`` replaced."""
        if stage_fn is not None:
            fields["stages"] = tuple(stage_fn(s) for s in self.stages)
        if comm is not None:
            fields["comm"] = tuple(c for c in self.comm if c.group != comm.group) + (comm,)
        return replace(self, **fields)

    def map_stages(self, fn: Callable[[StageMemory], StageMemory]) -> Estimate:
        """Apply ``fn`` to every representative stage's memory."""
        return replace(self, stages=tuple(fn(s) for s in self.stages))

    def comm_of(self, group: str) -> CommCost | None:
        for c in self.comm:
            if c.group == group:
                return c
        return None

    def with_comm(self, cost: CommCost) -> Estimate:
        """Add ``cost``, replacing an earlier entry of the same group."""
        rest = tuple(c for c in self.comm if c.group != cost.group)
        return replace(self, comm=rest + (cost,))

    def with_time(self, name: str, seconds: float, *, per_micro_batch: bool = False) -> Estimate:
        """Add ``seconds`` on the critical path under ``name`` (:data:`PER_MICRO_BATCH` if ``per_micro_batch``)."""
        return replace(self, other=self.other + (Term(name, seconds, PER_MICRO_BATCH if per_micro_batch else ""),))

    def slot_seconds(self, tp_exposed: float = 0.0) -> float:
        """One micro-batch's slot on the slowest stage, of which a pipeline's bubble idles: its
        compute, exposed TP communication and host work (checkpointing's, DTensor's, the schedule's)."""
        per_micro_batch = sum(t.value for t in self.other if t.phase == PER_MICRO_BATCH)
        return (self.compute + tp_exposed + per_micro_batch) / self.micro_batches

    def with_note(self, note: str) -> Estimate:
        return replace(self, notes=self.notes + (note,))

    # -- results ---------------------------------------------------------------------------

    def step_parts(self) -> dict[str, float]:
        """The step time split into named parts (seconds): compute, recompute, bubble, optimizer,
        each group's exposed communication ("TP exposed"), and the other named terms."""
        parts = {
            "compute": self.compute - self.recompute,
            "recompute": self.recompute,
            "bubble": self.bubble,
            "optimizer": self.optimizer,
        }
        for c in self.comm:
            parts[f"{c.group.upper()} exposed"] = c.exposed
        for t in self.other:
            parts[t.name] = t.value
        return parts

    @property
    def memory(self) -> StageMemory:
        """The worst pipeline rank: the memory every device must have."""
        return max(self.stages, key=lambda s: s.total)

    @property
    def memory_bytes(self) -> float:
        return self.peak_memory or self.memory.total

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.capacity

    @property
    def exposed_comm(self) -> float:
        return sum(c.exposed for c in self.comm)

    @property
    def step_s(self) -> float:
        return self.compute + self.bubble + self.optimizer + self.exposed_comm + sum(t.value for t in self.other)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_step / self.step_s

    @property
    def model_tflops_per_device(self) -> float:
        return self.model_flops / self.step_s / self.world_size / 1e12

    @property
    def hardware_tflops_per_device(self) -> float:
        return self.hardware_flops / self.step_s / self.world_size / 1e12

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation (Chowdhery et al. 2022, App. B)."""
        return self.model_flops / (self.step_s * self.world_size * self.peak)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation (recomputation counted)."""
        return self.hardware_flops / (self.step_s * self.world_size * self.peak)


@dataclass(frozen=True)
class CostPass:
    """One strategy's cost contribution, as the cost model runs it."""

    name: str
    cost: Callable[..., Estimate]
    options: object = None


@dataclass(frozen=True)
class Passes:
    """What the cost model runs for one layout: the active strategies' passes in composition order
    (the registry works them out, :meth:`planc.strategies.registry.Registry.passes`), and where
    those strategies put the pipeline stages (V-shaped only when ``pipeline`` runs ZBV)."""

    steps: tuple[CostPass, ...] = ()
    stage_style: StageStyle = "looped"

    def __iter__(self) -> Iterator[CostPass]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def plus(self, *more: CostPass) -> Passes:
        """These passes and then ``more`` (e.g. a plugin's pass under test)."""
        return Passes(self.steps + more, self.stage_style)
