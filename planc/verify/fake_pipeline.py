"""Pipeline parallelism on one simulated rank: what its schedule would have read from its peers.

``torch.distributed.pipelining`` talks to the other stages twice before its first micro-batch,
and both times it needs *values*, which neither the ``fake`` process group (collectives return at
once, nothing is received) nor fake tensors (``Tensor.item()`` raises) have:

1. the warm-up vote (``_PipelineSchedule._warmup_p2p``): every stage votes 1 when its user-given
   metadata is complete (static shapes) and 0 otherwise; the product, passed along the pipeline
   and back, picks static or dynamic metadata for all. planc builds its stages without metadata
   (``PipelineStage(part, stage, num_stages, device, group)``), so every stage votes 0 and the
   product is 0 whatever the peers vote: the rank's own votes decide it, and :func:`stand_in_peers`
   sets that outcome without the exchange (and refuses if this rank's stages ever vote 1);
2. dynamic metadata inference: each stage receives its input's metadata from the previous stage
   (``_recv_meta``) and its output gradient's from the next, running its own forward and backward
   on them to find what it sends on. planc's stages all pass the same tensor across every
   boundary -- the hidden state, :func:`boundary_meta` -- so what a peer would send is known here;
   and every message this rank sends is checked against it, so a wrong rule stops the simulation
   instead of measuring the wrong shapes (the first stage checks the rule's forward half, the
   last its backward half, a middle stage both).

The activations and gradients of the micro-batches themselves go over the ``fake`` group's
send/recv (shapes right, values not), as the other collectives do. The schedule's metadata
inference runs on its first step only; the simulation takes that step untracked and measures the
second, the one every later step repeats.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.pipelining._utils import (
    InferenceMode,
    _derive_grad_metas,
    _StageBackwardMeta,
    _StageForwardMeta,
    _TensorMeta,
)


class PeerRuleBroken(RuntimeError):
    """A stage of this rank sent metadata the peers' stand-in would not have (see :func:`boundary_meta`)."""


def boundary_meta(job) -> _TensorMeta:
    """What crosses every stage boundary of planc's pipeline: the hidden state of one micro-batch,
    ``[micro_batch, seq_len / sequence shards, hidden]`` (sequence parallelism splits the sequence
    over the tensor-parallel ranks, :attr:`planc.runtime.transformer.Transformer.sequence_shards`),
    in bf16 when a strategy took ``bf16``'s FSDP2 policy (bf16 working weights: the residual stream
    is bf16) and in fp32 otherwise (fp32 training, or autocast, whose residual stream stays fp32)."""
    mixed = job.mixed_precision
    dtype = mixed.policy.param_dtype if mixed is not None and mixed.taken else torch.float32
    shards = job.layout.tp if job.layout.sequence_parallel else 1
    shape = torch.Size((job.layout.micro_batch, job.plan.model.seq_len // shards, job.plan.model.hidden))
    stride = torch.empty(shape, device="meta").stride()
    return _TensorMeta(shape=shape, stride=stride, dtype=dtype, requires_grad=True)


def stand_in_peers(job) -> None:
    """Let ``job``'s pipeline schedule run on this rank alone: its warm-up vote decided from this
    rank's own votes, and its stages' metadata messages answered and checked by :func:`boundary_meta`."""
    activation = boundary_meta(job)
    (gradient,) = _derive_grad_metas((activation,))
    expected_forward, expected_backward = _StageForwardMeta((activation,)), _StageBackwardMeta((gradient,))

    def vote(stages, has_backward: bool, p2p_done: bool) -> None:
        if not any(InferenceMode.needs_dynamic(stage._user_meta, has_backward) for stage in stages):
            raise PeerRuleBroken(
                "this rank's pipeline stages have static metadata: the warm-up vote then depends on the "
                "other ranks' stages, which a one-rank simulation does not build"
            )
        for stage in stages:  # a 0 vote here makes the pipeline's product 0: dynamic, for every stage
            stage._inference_mode = InferenceMode.DYNAMIC

    job.schedule._warmup_p2p = vote
    for stage in job.stages:
        stage._recv_meta = _receiver(stage, expected_forward, expected_backward)
        stage._send_meta = _checker(stage, expected_forward, expected_backward)


def _receiver(stage, forward: _StageForwardMeta, backward: _StageBackwardMeta):
    def receive(src_stage: int):
        return forward if src_stage < stage.stage_index else backward

    return receive


def _checker(stage, forward: _StageForwardMeta, backward: _StageBackwardMeta):
    def send(meta, dst_stage: int) -> None:
        expected = forward if dst_stage > stage.stage_index else backward
        if meta != expected:
            raise PeerRuleBroken(
                f"pipeline stage {stage.stage_index} sends stage {dst_stage} {meta}, where the simulation "
                f"handed the other stages {expected} (planc.verify.fake_pipeline.boundary_meta is out of date)"
            )

    return send


@contextmanager
def sends_hold_their_tensors() -> Iterator[None]:
    """Inside the block a pipeline send's work holds the tensor it sends until it is waited on, as
    a real process group's does, and the ``fake`` group's does not (its send completes at once and
    keeps nothing). torch's multi-stage schedules wait on their sends only at the step's end, so
    a real run holds every stage output past its backward and every input gradient past its send
    until then (:func:`planc.stages.sends_held`; CPU processes over gloo, PP 2, v = 2: 7 boundary
    tensors at the second rank's peak that the simulation lacked, 16 % of the peak with 16
    micro-batches). Replaces ``_batch_p2p`` in torch's schedules module, which every schedule sends
    through; restored on exit."""
    from torch.distributed.pipelining import schedules

    posted = schedules._batch_p2p

    def batch_p2p(p2p_ops, desc=None):
        works = posted(p2p_ops, desc=desc)
        sent = [op.tensor for op in p2p_ops if op.op is dist.isend]
        return [_HoldingWork(work, sent) for work in works] if sent else works

    schedules._batch_p2p = batch_p2p
    try:
        yield
    finally:
        schedules._batch_p2p = posted


class _HoldingWork:
    """A work that keeps ``tensors`` alive until :meth:`wait` (everything else is the work's own)."""

    def __init__(self, work, tensors: list[torch.Tensor]) -> None:
        self._work, self._tensors = work, tensors

    def wait(self, *args, **kwargs):
        done = self._work.wait(*args, **kwargs)
        self._tensors = []
        return done

    def __getattr__(self, name: str):
        return getattr(self._work, name)
