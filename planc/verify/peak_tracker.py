"""The step's peak memory as torch's ``MemTracker`` sees it, for ``planc verify`` (a real step on
CPU) and ``planc verify --simulate`` (fake tensors): one tracker for both.

What the tracker needs told or spared, each found by running it:

- the tensors made before it starts: parameters, optimizer states, a pipeline's receive buffers,
  and the state a DDP communication hook keeps between steps (:mod:`planc.verify.model_states`);
- a root module's second forward (micro-batches): per-module statistics are reset at each, and a
  schedule's later backward of an earlier micro-batch finds none (:class:`StepPeakTracker` skips
  those hooks: an interleaved schedule's verify crashed at its peak step before, with a KeyError);
- a split backward (zero-bubble): no module input or output hooks (:func:`no_module_backward_hooks`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker


@contextlib.contextmanager
def tracking_the_step(job) -> Iterator[StepPeakTracker]:
    """A :class:`StepPeakTracker` over the step run inside the block, told of what ``job`` made
    before it, with per-module statistics reset at each root forward."""
    from planc.verify.model_states import comm_hook_state_tensors, pipeline_receive_buffers, state_holders

    tracker = StepPeakTracker()
    tracker.track_external(
        *job.model_parts,
        *state_holders(job.optimizers),
        *pipeline_receive_buffers(job),
        *comm_hook_state_tensors(job),
    )
    roots = {id(part) for part in job.model_parts}  # outermost (a DDP wrapper, not what it wraps)

    def new_micro_batch(module, args):  # the tracker refuses a second root forward per iteration
        if id(module) in roots:
            tracker.reset_mod_stats()

    handle = torch.nn.modules.module.register_module_forward_pre_hook(new_micro_batch)
    try:
        with no_module_backward_hooks(job.layout.schedule == "zero-bubble"), callbacks_inline(), tracker:
            yield tracker
    finally:
        handle.remove()


@contextlib.contextmanager
def callbacks_inline() -> Iterator[None]:
    """Inside the block a future's callback runs on the thread that attaches it, once the future
    is done, instead of on the thread that completes it (gloo's).

    The tracker is a dispatch mode, which is the thread's own: what a callback allocates on another
    thread it never sees. DDP communication hooks chain their work that way -- PowerSGD makes its
    new error-feedback residual (``input_tensor_cp - input_tensor``) in the last callback, beside
    the bucket's copy and the old residual -- and the step's peak then depended on which thread
    won: 2 CPU processes, the CPU matrix's ``ddp-powersgd``, 1 run in 6 measured that moment
    (13.4 MB), the others 12.2 MB. The comm counter follows callbacks onto their thread instead
    (:mod:`planc.verify.comm_counter`); the tracker, whose state one thread updates at a time,
    runs them here. The values are the same; only the hook's overlap with the backward is lost,
    in the one tracked step."""
    original = torch._C.Future.then

    def then(future, callback):
        future.wait()
        return original(future, callback)  # done: torch runs the callback here, now

    setattr(torch._C.Future, "then", then)  # noqa: B010 (a method of a C++ class, for this block only)
    try:
        yield
    finally:
        setattr(torch._C.Future, "then", original)  # noqa: B010


def peak_by_category(tracker: MemTracker, device: torch.device) -> dict:
    """``{"bytes": the step's peak, "parts": {category: bytes}}`` on ``device``."""
    peak = tracker.get_tracker_snapshot("peak").get(device, {})
    return {
        "bytes": peak.get("Total", 0),
        "parts": {getattr(k, "value", str(k)): v for k, v in peak.items() if k != "Total"},
    }


@contextlib.contextmanager
def no_module_backward_hooks(active: bool) -> Iterator[None]:
    """Under a split backward, keep the tracker's module tracker from hooking module outputs.

    ``ModTracker`` hooks every module's inputs and outputs (``register_multi_grad_hook``) to know
    when backward reaches it. The zero-bubble schedules take gradients with ``autograd.grad`` --
    inputs first, weights later -- and hooks that never fire hold their graphs, saved tensors
    included: simulated peaks grew linearly with the micro-batch count (tiny model, 4 -> 16: 26 ->
    31 MiB without recomputation, 30 -> 55 MiB with full; a 70B plan read 610 GB) while a real
    2-process CPU run held what interleaved holds (peak RSS 0.84 vs 0.86 GiB, 32 micro-batches).
    Without the hooks the peaks are the cost model's within 1% at 4 micro-batches. The step's
    total is unchanged by them; only the split of the backward's tensors into "Activation" and
    "Temp" is lost (the tracker cannot tell backward from forward)."""
    if not active:
        yield
        return
    from torch.distributed._tools import mod_tracker

    original = mod_tracker.register_multi_grad_hook
    mod_tracker.register_multi_grad_hook = _no_hook  # type: ignore[assignment]  # a stand-in with the same use
    try:
        yield
    finally:
        mod_tracker.register_multi_grad_hook = original


class _NoHandle:
    def remove(self) -> None:
        pass


def _no_hook(tensors, fn, **kwargs) -> _NoHandle:
    return _NoHandle()


class StepPeakTracker(MemTracker):
    """torch's ``MemTracker`` keeping the step's peak only, not every active module's own.

    After each op ``MemTracker._update_peak_stats`` walks every module seen in the iteration
    (hundreds in a 32-block model) to update per-module peaks this comparison does not use: three
    quarters of the simulation's time at llama3-8b. The step's peak and its snapshot by category
    are kept exactly as ``MemTracker`` keeps them.

    Per-module statistics are reset at each micro-batch's first forward (:func:`tracking_the_step`); a
    pipeline schedule runs an earlier micro-batch's backward after that (1F1B, and a V schedule's
    later stage on the same rank), whose module hooks then find no statistics: they are skipped
    (they only record per-module snapshots; the step's peak does not depend on them).
    """

    def _pre_bw_hook(self, module, args) -> None:
        if module is None or module in self.memory_tracking:
            super()._pre_bw_hook(module, args)

    def _post_bw_hook(self, module, args) -> None:
        if module is None or module in self.memory_tracking:
            super()._post_bw_hook(module, args)

    def _update_peak_stats(self, peak_state) -> None:
        for device, snapshot in self._curr_mem_snap.items():
            if self._peak_mem.get(device, 0) < snapshot[_TOTAL_KEY]:
                self._peak_mem[device] = snapshot[_TOTAL_KEY]
                self._peak_mem_snap[device] = dict(snapshot)
