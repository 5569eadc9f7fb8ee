"""A step's bookkeeping over the ranks: the global mean loss, the stop vote and the peak memory.

Every rank contributes three numbers after its optimizer step, and every rank learns the three
results:

* its share of the global-batch mean loss (:func:`loss_share`), summed. The loss is replicated
  over tensor parallelism and only the last pipeline stage has it, so exactly one rank per
  data-parallel rank contributes (tp rank 0 of the last stage) and the others give 0;
* its stop flag, 0 or 1 (a SIGTERM or Ctrl-C it received), summed: the vote;
* its peak memory, of which the maximum is the step's ``memory_bytes``: ranks differ (pipeline
  stages hold different activations and the last one the logits; vocabulary padding and uneven
  FSDP shards fall on some ranks), and planc predicts the worst device.

Each collective is a meeting with every other rank, which on an oversubscribed CPU costs a
descheduled process's wake-up (1-2 % of a step of bench/overhead.py's DDP and FSDP programs on
2 gloo ranks), so up to :data:`GATHER_RANKS` ranks the three travel in one all-gather (sums and
the maximum are taken after it). A ring all-gather's latency grows with the number of ranks --
NCCL gathers over a ring, one hop per rank -- so on more ranks they go in two all-reduces, a sum
and a maximum, whose latency grows with its logarithm (NCCL's trees).

float64 throughout: exact for bytes below 2^53, and for the float32 loss and the votes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from planc.runtime import metrics

#: Most ranks whose numbers travel in one all-gather (see the module's docstring).
GATHER_RANKS = 64


def loss_share(job, local_loss: torch.Tensor | None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """This rank's share of the global-batch mean loss, a 1-element tensor: its data-parallel
    rank's mean over dp from tp rank 0 of the last stage (which holds the plain loss), 0 elsewhere.
    Summed over all ranks it is the global mean."""
    if local_loss is not None and job.coordinates["tp"] == 0:
        return local_loss.to(dtype).reshape(1) / job.layout.dp
    return torch.zeros(1, dtype=dtype, device=job.device)


class StepSummary:
    """Started when the step's work is queued; :meth:`results` waits for it."""

    def __init__(self, job, local_loss: torch.Tensor | None, stop_flag: bool):
        device = job.device
        # ``torch.full`` from host numbers (a fill, not a copy): a copy would wait for the device's
        # queue on a GPU. Every allocation of the step is made by now (a GPU's caching allocator
        # counts them as they are queued).
        flag = torch.full((1,), 1.0 if stop_flag else 0.0, dtype=torch.float64, device=device)
        peak = torch.full((1,), float(metrics.peak_memory_bytes(device)), dtype=torch.float64, device=device)
        self._sums, self._peak = torch.cat([loss_share(job, local_loss), flag]), peak
        self._gathered: torch.Tensor | None = None
        self._works: list = []
        world = dist.get_world_size()
        if 1 < world <= GATHER_RANKS:
            gathered = torch.empty(world * 3, dtype=torch.float64, device=device)  # flat, as gloo wants it
            mine = torch.cat([self._sums, peak])
            self._works.append(dist.all_gather_into_tensor(gathered, mine, async_op=True))
            self._gathered = gathered.view(world, 3)
        elif world > GATHER_RANKS:
            self._works.append(dist.all_reduce(self._sums, async_op=True))
            self._works.append(dist.all_reduce(self._peak, op=dist.ReduceOp.MAX, async_op=True))

    def results(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(global mean loss, ranks that asked to stop, largest peak memory in bytes): 0-dim float64
        tensors, the same on every rank, not yet read on the host."""
        for work in self._works:
            work.wait()
        if self._gathered is not None:
            shares, votes, peaks = self._gathered.unbind(1)
            return shares.sum(), votes.sum(), peaks.max()
        return self._sums[0], self._sums[1], self._peak[0]
