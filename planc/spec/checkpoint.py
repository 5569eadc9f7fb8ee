"""The optional ``checkpoint`` block: when and where to save distributed checkpoints."""

from __future__ import annotations

from planc.spec.fields import Flag, PositiveInt, SpecModel


class CheckpointSpec(SpecModel):
    """Save a torch.distributed.checkpoint (DCP) every ``every`` steps, keeping the last ``keep``."""

    every: PositiveInt
    """Save every this many optimizer steps."""
    dir: str = "checkpoints"
    """Directory of the checkpoints, relative to the run directory."""
    keep: PositiveInt = 3
    """How many of the newest checkpoints to keep; older ones are deleted after a save succeeds."""
    resume: Flag = True
    """Resume from the newest complete checkpoint in dir when one exists."""
