"""Alpha-beta costs of the collectives (Hockney 1994; Thakur, Rabenseifner & Gropp 2005).

A message of n bytes over a link of bandwidth beta and start-up latency alpha costs
alpha + n / beta. For a group of p ranks whose slowest hop has (alpha, beta) — see
:class:`planc.hardware.GroupLink` — and a buffer of n bytes (the full, unsharded size):

- ring all-reduce (reduce-scatter then all-gather): 2 (p - 1) alpha + 2 (p - 1)/p * n / beta
- tree all-reduce (NCCL's double binary tree, Sanders et al. 2009): 2 log2(p) alpha + 2 n / beta
  — the latency term grows with log p instead of p; NCCL picks whichever is faster, so do we;
- switch all-reduce (NVLink SHARP, H100/H200 inside a node): each rank sends its buffer to the
  NVSwitch once and receives the sum once, 2 alpha + n / beta_switch, beta_switch the algorithm
  bandwidth NCCL reaches (:mod:`planc.spec.presets.hardware`); NCCL uses it where it beats the ring;
- ring reduce-scatter / all-gather: (p - 1) alpha + (p - 1)/p * n / beta
- point-to-point: alpha + n / beta;
- k broadcasts that together fill an n-byte buffer, each from the rank that owns its part
  (ZeroRedundancyOptimizer's parameter-by-parameter sync): k ceil(log2 p) alpha + (p - 1)/p * n / beta
  -- the bytes of one all-gather, but a (tree) latency per broadcast.

(alpha, beta) are the group's (:meth:`~planc.hardware.topology.GroupLink.alpha_beta`): per
collective kind where a hardware profile measured that kind, else the link's.
"""

from __future__ import annotations

import math

from planc.hardware.topology import GroupLink


def all_reduce_seconds(nbytes: float, link: GroupLink) -> float:
    """Fastest of ring, tree and (where the node's switch reduces) switch all-reduce of ``nbytes``."""
    p = link.size
    if p <= 1 or nbytes <= 0:
        return 0.0
    alpha, beta = link.alpha_beta("all_reduce")
    ring = 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / beta
    tree = 2 * math.ceil(math.log2(p)) * alpha + 2 * nbytes / beta
    if link.switch_all_reduce_bw > 0:
        return min(ring, tree, 2 * alpha + nbytes / link.switch_all_reduce_bw)
    return min(ring, tree)


def switch_beats_ring(link: GroupLink) -> bool:
    """Whether a large all-reduce over ``link`` runs faster in the node's switch than as a ring:
    n / beta_switch below 2 (p - 1)/p * n / beta (4 or more H100s, not 2 or 3)."""
    p = link.size
    return p > 1 and link.switch_all_reduce_bw > link.bandwidth * p / (2 * (p - 1))


def _ring_seconds(kind: str, nbytes: float, link: GroupLink) -> float:
    p = link.size
    if p <= 1 or nbytes <= 0:
        return 0.0
    alpha, beta = link.alpha_beta(kind)
    return (p - 1) * alpha + (p - 1) / p * nbytes / beta


def reduce_scatter_seconds(nbytes: float, link: GroupLink) -> float:
    """Ring reduce-scatter of an ``nbytes`` buffer (each rank keeps nbytes / p)."""
    return _ring_seconds("reduce_scatter", nbytes, link)


def all_gather_seconds(nbytes: float, link: GroupLink) -> float:
    """Ring all-gather into an ``nbytes`` buffer (each rank contributes nbytes / p)."""
    return _ring_seconds("all_gather", nbytes, link)


def broadcasts_seconds(count: int, nbytes: float, link: GroupLink) -> float:
    """``count`` broadcasts that together fill an ``nbytes`` buffer on every rank, each from the rank
    that owns that part (each rank receives the (p - 1)/p it does not own). A hardware profile's
    broadcast fit prices them where it has one; else the link's (all-reduce) latency and bandwidth."""
    p = link.size
    if p <= 1 or nbytes <= 0:
        return 0.0
    alpha, beta = link.alpha_beta("broadcast")
    return count * math.ceil(math.log2(p)) * alpha + (p - 1) / p * nbytes / beta


def p2p_seconds(nbytes: float, link: GroupLink) -> float:
    """One point-to-point transfer of ``nbytes``."""
    if link.size <= 1 or nbytes <= 0:
        return 0.0
    alpha, beta = link.alpha_beta("send_recv")
    return alpha + nbytes / beta


#: Bytes of one gradient-norm partial that the step all-reduces (one fp32 scalar).
NORM_BYTES = 4


def norm_reductions(count: int, link: GroupLink) -> tuple[float, float]:
    """(seconds, bytes one rank sends) of ``count`` all-reduces of a partial gradient norm over
    ``link``'s group, one after another: the clipping waits for the whole norm
    (planc.runtime.grad_norm.grad_norm: one per kind of sharded gradient and mesh dimension it
    is sharded on, as ``DTensor.full_tensor`` would reduce it, and one over the pipeline's stages)."""
    p = link.size
    if p <= 1 or count <= 0:
        return 0.0, 0.0
    return count * all_reduce_seconds(NORM_BYTES, link), count * 2 * (p - 1) / p * NORM_BYTES


#: Up to this many ranks the step's summary is one all-gather, beyond it two all-reduces
#: (planc.runtime.step_summary.GATHER_RANKS; a test holds the two equal).
SUMMARY_GATHER_RANKS = 64
#: What each rank contributes to the summary: its loss share, stop vote and peak memory (float64).
SUMMARY_VALUES = 3


def step_summary_seconds(link: GroupLink) -> float:
    """The step's one bookkeeping collective over every rank, after the optimizer step and waited
    on (planc.runtime.step_summary): an all-gather of three float64 per rank, or on more than
    :data:`SUMMARY_GATHER_RANKS` ranks an all-reduce of two (the sums) and one of the maximum. A
    latency term: 0.2-0.5 ms on gloo here, tens of microseconds on NCCL."""
    p = link.size
    if p <= 1:
        return 0.0
    if p <= SUMMARY_GATHER_RANKS:
        return all_gather_seconds(8.0 * SUMMARY_VALUES * p, link)
    return all_reduce_seconds(8.0 * (SUMMARY_VALUES - 1), link) + all_reduce_seconds(8.0, link)
