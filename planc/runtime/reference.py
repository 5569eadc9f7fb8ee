"""The single-process reference trainer: what every parallel layout must reproduce.

Plain PyTorch, no torch.distributed: the same model, init, data order, optimizer, LR schedule and
clipping as the distributed program, the full global batch per step, split into micro-batches
whose gradients accumulate (each micro-batch loss divided by their number, so the gradient is
that of the mean loss over the global batch). fp32; or bf16 over fp32 master weights, either on
bf16 copies of the parameters (``bf16_weights=True``: what FSDP2's ``MixedPrecisionPolicy`` does
for ``ddp`` and ``fsdp``) or under ``torch.autocast`` (ZeRO-1, no data parallelism).

    python -m planc.runtime.reference run/plan.json --steps 20
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from planc.runtime.checkpoint import load_checkpoint
from planc.runtime.checkpoint_write import save_checkpoint
from planc.runtime.data import build_data, build_validation, inputs_and_targets, split_micro_batches
from planc.runtime.optim import build_lr_scheduler, build_optimizer, clip_grad_norm_
from planc.runtime.transformer import build_model, loss_fn
from planc.spec import Plan
from planc.weights.import_hf import initialise


@dataclass
class ReferenceRun:
    """Per-step results of a reference run; index i is optimizer step ``first_step + i`` (0-based)."""

    first_step: int = 0
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    val_losses: dict[int, float] = field(default_factory=dict)
    """Validation loss by step (1-based count of finished steps), at the steps the program evaluates."""


def _micro_batch(plan: Plan, micro_batch: int | None) -> int:
    if micro_batch is None:
        micro_batch = plan.train.micro_batch if isinstance(plan.train.micro_batch, int) else plan.train.global_batch
    if plan.train.global_batch % micro_batch:
        raise ValueError(f"micro_batch {micro_batch} does not divide global_batch {plan.train.global_batch}")
    return micro_batch


def _autocast(precision: str, device: str) -> Callable[[], contextlib.AbstractContextManager]:
    """bf16: autocast runs the matmuls in bf16 while parameters, gradients and Adam states stay fp32."""
    if precision != "bf16":
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


class _Bf16Weights:
    """bf16 working copies of an fp32 model's parameters (buffers untouched, as FSDP2's policy):
    refreshed from the fp32 masters before each step; after each micro-batch's backward their
    bf16 gradients are cast to fp32 and summed into the masters' ``.grad`` (FSDP2 reduces and
    accumulates in the policy's fp32 ``reduce_dtype``)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.master, self.module = model, copy.deepcopy(model)
        for param in self.module.parameters():
            param.data = param.data.to(torch.bfloat16)

    @torch.no_grad()
    def refresh(self) -> None:
        for working, master in zip(self.module.parameters(), self.master.parameters(), strict=True):
            working.copy_(master)

    @torch.no_grad()
    def fold_gradients(self) -> None:
        for working, master in zip(self.module.parameters(), self.master.parameters(), strict=True):
            if working.grad is not None:
                grad = working.grad.float()
                master.grad = grad if master.grad is None else master.grad.add_(grad)
                working.grad = None


def _accumulate_gradients(forward, micro_batches, copies: _Bf16Weights | None, autocast, device: str, vocab: int):
    """Forward and backward every micro-batch (loss / their number); the summed loss."""
    step_loss = torch.zeros((), device=device)
    if copies is not None:
        copies.refresh()
    for batch in micro_batches:
        inputs, targets = inputs_and_targets(batch.to(device))
        with autocast():
            logits = forward(inputs)
        loss = loss_fn(logits, targets, vocab) / len(micro_batches)
        loss.backward()
        if copies is not None:
            copies.fold_gradients()
        step_loss += loss.detach()
    return step_loss


def train_reference(
    plan: Plan,
    *,
    steps: int | None = None,
    micro_batch: int | None = None,
    checkpoint_dir: str | Path | None = None,
    data_dir: str | Path | None = None,
    device: str = "cpu",
    on_step: Callable[[int, float], None] | None = None,
    bf16_weights: bool = False,
) -> ReferenceRun:
    """Train ``plan``'s model to ``steps`` optimizer steps (default ``plan.train.steps``) in one process.

    The LR schedule always follows ``plan.train.steps``, so a shorter run is a prefix of the full one.

    ``checkpoint_dir``: save there every ``plan.checkpoint.every`` steps (keeping ``keep``) and resume
    from the newest complete checkpoint in it. ``on_step(step, loss)`` is called after each step
    (1-based count of finished steps). ``bf16_weights``: with ``precision = bf16``, compute on bf16
    copies of the parameters (the layouts whose data parallelism takes FSDP2's policy) instead of
    under autocast.
    """
    spec, train = plan.model, plan.train
    total_steps = steps if steps is not None else train.steps
    micro = _micro_batch(plan, micro_batch)

    model = build_model(spec, device=device)
    data_dir = data_dir if data_dir is not None else plan.data_root
    initialise(model, spec, train.seed, root=data_dir)  # seeded init, or init = pretrained's weights
    optimizer = build_optimizer(model.parameters(), train)
    scheduler = build_lr_scheduler(optimizer, train)
    data = build_data(train, spec, base_dir=data_dir)
    validation = build_validation(train, spec, base_dir=data_dir)

    start = 0
    if checkpoint_dir is not None:
        resumed = load_checkpoint(checkpoint_dir, [model], [optimizer], [scheduler])
        start = resumed["step"] if resumed else 0

    copies = _Bf16Weights(model) if bf16_weights and train.precision == "bf16" else None
    forward = copies.module if copies is not None else model
    autocast = _autocast(train.precision if copies is None else "fp32", device)
    run = ReferenceRun(first_step=start)
    model.train()
    for step in range(start, total_steps):
        micro_batches = split_micro_batches(data.batch_for_step(step), micro)
        optimizer.zero_grad(set_to_none=True)
        step_loss = _accumulate_gradients(forward, micro_batches, copies, autocast, device, spec.vocab)
        norm = clip_grad_norm_(model.parameters(), train.grad_clip)
        run.lrs.append(float(scheduler.get_last_lr()[0]))
        optimizer.step()
        scheduler.step()
        run.losses.append(step_loss.item())
        run.grad_norms.append(norm.item())
        if on_step is not None:
            on_step(step + 1, run.losses[-1])
        if validation is not None and ((step + 1) % train.eval_every == 0 or step + 1 == total_steps):
            if copies is not None:
                copies.refresh()
            run.val_losses[step + 1] = _validation_loss(
                forward, validation, train.eval_batches, device, autocast, spec.vocab
            )
        if checkpoint_dir is not None and plan.checkpoint is not None and (step + 1) % plan.checkpoint.every == 0:
            save_checkpoint(checkpoint_dir, step + 1, [model], [optimizer], [scheduler], keep=plan.checkpoint.keep)
    return run


@torch.no_grad()
def _validation_loss(model, validation, batches: int, device: str, autocast, vocab: int) -> float:
    """Mean next-token loss over validation batches 0..batches-1, each whole batch in one forward."""
    total = 0.0
    for index in range(batches):
        inputs, targets = inputs_and_targets(validation.batch_for_step(index).to(device))
        with autocast():
            logits = model(inputs)
        total += loss_fn(logits, targets, vocab).item()
    return total / batches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m planc.runtime.reference", description="Train a plan in one process and print the losses."
    )
    parser.add_argument("plan", help="a plan.json (as written by `planc check --json` or into a run directory)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the plan's train.steps)")
    parser.add_argument(
        "--micro-batch", type=int, default=None, help="sequences per micro-batch (default: plan's, else all)"
    )
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    args = parser.parse_args(argv)
    path = Path(args.plan)
    try:
        plan = Plan.from_json(path.read_text(encoding="utf-8"))
    except OSError as err:
        print(f"error: cannot read {path}: {err.strerror}", file=sys.stderr)
        return 2
    except ValueError as err:  # pydantic's ValidationError, a JSON syntax error
        print(f"error: {path} is not a valid plan.json:\n{err}", file=sys.stderr)
        return 2
    try:
        train_reference(
            plan,
            steps=args.steps,
            micro_batch=args.micro_batch,
            device=args.device,
            on_step=lambda step, loss: print(f"step {step} loss {loss:.6f}", flush=True),
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
