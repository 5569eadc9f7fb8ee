"""The ``train`` block: batch, precision, optimizer, schedule and data."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field

from planc.spec.fields import Auto, NonNegativeInt, PositiveInt, Seconds, SpecModel

#: 2**24 sequences (tens of billions of tokens) per step: far beyond any published run (GPT-3
#: and Llama 3 405B step on about 1,600-16,000 sequences); a larger number is a typo, and the
#: planner enumerates its divisors.
MAX_GLOBAL_BATCH = 2**24
#: 10^9 optimizer steps: a thousand times the longest published runs (T5 and GPT-2 trained for
#: 0.5-1 M steps); a larger number is a typo, and its training time would read 10^13 days.
MAX_STEPS = 10**9


def _one_or_many(value: object) -> object:
    """``log = tensorboard`` is a list of one; repeated names count once, in the order written."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, (list, tuple)):
        return tuple(dict.fromkeys(value))
    return value


class TrainSpec(SpecModel):
    """How to train: global batch, micro-batch, precision, optimizer and learning-rate schedule."""

    global_batch: Annotated[int, Field(gt=0, le=MAX_GLOBAL_BATCH, strict=True)]
    """Sequences per optimizer step, summed over all data-parallel ranks and micro-batches."""
    micro_batch: PositiveInt | Auto = "auto"
    """Sequences per forward/backward on one data-parallel rank (auto: the planner picks)."""
    precision: Literal["fp32", "bf16"] = "bf16"
    """Compute precision: fp32, or bf16 with fp32 master weights and optimizer states."""
    optimizer: Literal["adamw", "adam", "sgd"] = "adamw"
    """Optimizer: adamw (decoupled weight decay), adam, or sgd with momentum 0.9."""
    lr: float = Field(default=3e-4, gt=0)
    """Peak learning rate, reached after warmup."""
    min_lr: float = Field(default=0.0, ge=0)
    """Learning rate at the end of the cosine decay."""
    warmup_steps: NonNegativeInt = 0
    """Steps of linear warmup from 0 to lr."""
    steps: Annotated[int, Field(gt=0, le=MAX_STEPS, strict=True)] = 1000
    """Optimizer steps to train (planc run --steps overrides)."""
    weight_decay: float = Field(default=0.1, ge=0)
    """Weight decay (decoupled for adamw; L2 for adam and sgd)."""
    beta1: float = Field(default=0.9, ge=0, lt=1)
    """Adam's first-moment decay (sgd: momentum)."""
    beta2: float = Field(default=0.95, ge=0, lt=1)
    """Adam's second-moment decay."""
    grad_clip: float = Field(default=1.0, ge=0)
    """Clip the global gradient norm to this value; 0 turns clipping off."""
    data: str = "synthetic"
    """Training data: "synthetic" (a learnable token stream), a token file (.bin: planc prepare, nanoGPT or
    Megatron-LM) or a text file read as bytes; a relative path is relative to the .plan file."""
    val_data: str | None = None
    """Validation data, in the forms data takes ("synthetic": held-out walks of the same chain)."""
    eval_every: PositiveInt = 100
    """Compute the validation loss every this many steps, and after the last one (needs val_data)."""
    eval_batches: PositiveInt = 10
    """Global batches of validation data per evaluation (the same batches every time)."""
    seed: NonNegativeInt = 0
    """Seed of the weight initialisation and the synthetic data; identical across layouts."""
    log_every: PositiveInt = 1
    """Print progress every this many steps (metrics.jsonl gets every step)."""
    log: Annotated[tuple[str, ...], BeforeValidator(_one_or_many)] = ()
    """Metrics sinks besides metrics.jsonl: tensorboard, wandb, or a sink plugin's name (planc run --log adds)."""
    timeout: Seconds = Field(default=600.0, gt=0)
    """Collective timeout: a collective that waits longer ends every rank with a report naming the rank
    that did not arrive, the collective and the step. Must exceed the longest checkpoint save or load."""


def steps_beyond_schedule(train: TrainSpec, steps: int) -> tuple[str | None, str | None]:
    """(refusal, warning) for training ``steps`` steps when the plan's schedule spans ``train.steps``.

    The warmup and cosine decay are laid over ``train.steps``; steps past it hold ``min_lr``. With
    ``min_lr = 0`` they would not change the weights (AdamW's decoupled decay is scaled by lr too),
    so they are refused; otherwise they run, with a warning.
    """
    if steps <= train.steps:
        return None, None
    if train.min_lr == 0:
        return (
            f"--steps {steps} goes beyond train.steps = {train.steps}, where the learning-rate schedule has "
            "decayed to min_lr = 0: the extra steps would not change the weights; raise train.steps in the "
            "plan (the schedule is laid over it), or set min_lr > 0 to continue at min_lr",
            None,
        )
    return None, (
        f"steps {train.steps + 1}..{steps} train at the constant min_lr = {train.min_lr:g}: the schedule is "
        f"laid over train.steps = {train.steps} (raise it to stretch the schedule instead)"
    )
