"""What activation checkpointing costs under the zero-bubble schedules' split backward, measured.

    python bench/split_backward_recompute.py     # a table, about 10 s

torch's zero-bubble schedules split each stage's backward in two: input gradients
(``torch.distributed.pipelining._backward.stage_backward_input``), then weight gradients
(``stage_backward_weight``), which walks the graph again from one root per parameter group. This
runs both on a chunk of planc's own blocks (Llama-style: RMSNorm, RoPE, SwiGLU), plain and under
full recomputation (``checkpoint_wrapper``, non-reentrant, as planc's ``recompute`` strategy wraps
them), and prints how many block forwards each half reran and its peak of live tensor storage
(``bench/loss_memory.py``'s ``PeakBytes``: every storage an op creates, until it is freed),
beside 1F1B's one backward (``torch.autograd.backward``) for reference.

What it shows (torch 2.13, 4 blocks): under checkpointing the weight half reruns each block's
forward once per parameter group -- 9 times per block -- and holds those reruns at once: its peak
is several times the whole chunk's without recomputation. Why planc does not run zero-bubble with
recomputation (``planc.legality.rules.zero_bubble_with_recompute``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loss_memory import PeakBytes  # noqa: E402

from planc.runtime.transformer import build_model  # noqa: E402
from planc.spec import build_plan  # noqa: E402

MODEL = dict(
    layers=4, hidden=256, heads=4, vocab=256, seq_len=256, mlp="swiglu", norm="rmsnorm", position="rope", bias=False
)
MICRO_BATCH = 2


def measure(checkpointed: bool, split: bool) -> dict:
    """Block forwards and peak MiB of each backward half (or of the one backward when not ``split``)."""
    torch.manual_seed(0)
    spec = build_plan({"model": MODEL, "hardware": {"device": "cpu"}, "train": {"global_batch": 8}}).model
    blocks = list(build_model(spec, device="cpu").layers.values())
    forwards = [0]
    for block in blocks:
        block.register_forward_pre_hook(lambda module, args: forwards.__setitem__(0, forwards[0] + 1))
    chunk = [checkpoint_wrapper(b, preserve_rng_state=False) if checkpointed else b for b in blocks]
    x = torch.randn(MICRO_BATCH, spec.seq_len, spec.hidden, requires_grad=True)
    row: dict = {}
    with PeakBytes() as peak:
        out = x
        for block in chunk:
            out = block(out)
        row["held after forward"] = peak.current
        grad = torch.ones_like(out)
        before = forwards[0]
        peak.peak = 0
        if not split:
            torch.autograd.backward(out, grad)
            row["backward"] = (forwards[0] - before, peak.peak)
            return row
        grads_in, groups = stage_backward_input([out], [grad], [x], (p for b in blocks for p in b.parameters()))
        row["input half"] = (forwards[0] - before, peak.peak)
        grad_input = grads_in[0].untyped_storage().nbytes()
        row["kept between the halves"] = peak.current - row["held after forward"] - grad_input
        before, peak.peak = forwards[0], 0
        stage_backward_weight((p for b in blocks for p in b.parameters()), groups)
        row["weight half"] = (forwards[0] - before, peak.peak)
        row["parameter groups"] = len(groups)
    return row


def main() -> None:
    mib = 2**20
    print(f"{MODEL['layers']} Llama-style blocks, hidden {MODEL['hidden']}, {MODEL['seq_len']} tokens x {MICRO_BATCH}")
    print("| backward | recompute | held after forward | pass: block forwards rerun, peak (and what the split keeps) |")
    print("|---|---|---:|---|")
    for split in (False, True):
        for checkpointed in (False, True):
            row = measure(checkpointed, split)
            passes = [(k, v) for k, v in row.items() if isinstance(v, tuple)]
            text = "; ".join(f"{name}: {n} forwards, {p / mib:.1f} MiB" for name, (n, p) in passes)
            if "kept between the halves" in row:
                text += f"; kept between the halves: {row['kept between the halves'] / mib:.1f} MiB"
            kind = "split (zero-bubble)" if split else "one (1F1B)"
            held = row["held after forward"] / mib
            print(f"| {kind} | {'full' if checkpointed else 'none'} | {held:.1f} MiB | {text} |")


if __name__ == "__main__":
    main()
