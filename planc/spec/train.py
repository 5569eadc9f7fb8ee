"""The ``train`` block: batch, precision, optimizer, schedule and data."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from planc.spec.fields import Auto, NonNegativeInt, PositiveInt, Seconds, SpecModel

#: 2**24 sequences (tens of billions of tokens) per step: far beyond any published run (GPT-3
#: and Llama 3 405B step on about 1,600-16,000 sequences); a larger number is a typo, and the
#: planner enumerates its divisors.
MAX_GLOBAL_BATCH = 2**24


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
    steps: PositiveInt = 1000
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
    """Training data: "synthetic" (deterministic learnable token stream) or a text file path."""
    seed: NonNegativeInt = 0
    """Seed of the weight initialisation and the synthetic data; identical across layouts."""
    log_every: PositiveInt = 1
    """Print progress every this many steps (metrics.jsonl gets every step)."""
    timeout: Seconds = Field(default=600.0, gt=0)
    """Collective timeout: a collective that waits longer ends every rank with a report naming the rank
    that did not arrive, the collective and the step. Must exceed the longest checkpoint save or load."""
