"""The validated ``Plan``: everything the planner, code generator and runtime consume."""

from __future__ import annotations

from typing import Any

from pydantic import Field, computed_field, model_validator

from planc.spec.checkpoint import CheckpointSpec
from planc.spec.fields import SpecModel
from planc.spec.hardware import HardwareSpec
from planc.spec.layout import LayoutSpec
from planc.spec.model import ModelSpec
from planc.spec.train import TrainSpec


class PluginUse(SpecModel):
    """A ``use NAME { ... }`` block: a strategy plugin by its registered name, with options."""

    name: str
    """Registered strategy name (see `planc plugins`)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options as written; the strategy's own Options model validates them. Unit literals
    arrive as numbers in base units (bytes, B/s, FLOP/s, s)."""
    units: dict[str, tuple[str, str]] = Field(default_factory=dict, exclude=True)
    """For each option written with a unit in a .plan file: (unit kind, the text as written), so
    the strategy's Options can reject ``bucket = 5 ms`` for a size (not stored in plan.json)."""
    unitless: tuple[str, ...] = Field(default=(), exclude=True)
    """The options a .plan file wrote as a bare number, so the strategy's Options can reject
    ``bucket = 25`` for a size (25 what? PyTorch's ``bucket_cap_mb=25`` means megabytes). Not
    stored in plan.json, whose numbers are in base units."""


class Plan(SpecModel):
    """A validated ``.plan``: model, hardware, training, requested layout, checkpoints, plugins."""

    model: ModelSpec
    """The transformer to train."""
    hardware: HardwareSpec
    """The devices and their links."""
    train: TrainSpec
    """Batch, precision, optimizer, schedule and data."""
    layout: LayoutSpec = LayoutSpec()
    """The requested parallel layout (auto keys are planned)."""
    checkpoint: CheckpointSpec | None = None
    """Distributed checkpointing, if any."""
    uses: tuple[PluginUse, ...] = ()
    """Strategy plugins named with `use`, in the order written."""
    source: str | None = None
    """The file the plan was read from, if any."""
    notes: tuple[str, ...] = ()
    """Approximations made while reading the plan (e.g. an HF config feature planc does not model)."""
    data_root: str | None = None
    """The directory relative data paths resolve against: the .plan file's, recorded when the plan names
    a data file (or ``init = pretrained``'s weights) by a relative path (the program's --data-root
    replaces it on another machine)."""

    @model_validator(mode="before")
    @classmethod
    def _drop_computed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "tokens_per_step" in data:
            data = {k: v for k, v in data.items() if k != "tokens_per_step"}
        return data

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented form
    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step: global_batch x seq_len."""
        return self.train.global_batch * self.model.seq_len

    @property
    def world_size(self) -> int:
        return self.hardware.world_size

    def to_json(self) -> str:
        """The plan as JSON (what `planc check --json` prints and a run directory stores)."""
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """Read a plan written by :meth:`to_json` (derived fields are recomputed, not trusted)."""
        return cls.model_validate_json(text)
