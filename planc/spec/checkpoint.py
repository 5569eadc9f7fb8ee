"""The optional ``checkpoint`` block: when and where to save distributed checkpoints."""

from __future__ import annotations

from pydantic import Field

from planc.spec.fields import Flag, NonNegativeInt, PositiveInt, Seconds, SpecModel

#: torchrun restarts after a failure when the plan's checkpoint block does not say (torchrun's own default is 0).
DEFAULT_MAX_RESTARTS = 3
#: Seconds a stop (SIGTERM, Ctrl-C) may take to finish the step in flight and save, also without a checkpoint block.
DEFAULT_STOP_DEADLINE = 60.0


class CheckpointSpec(SpecModel):
    """Save a torch.distributed.checkpoint (DCP) every ``every`` steps, keeping the last ``keep``."""

    every: PositiveInt
    """Save every this many optimizer steps."""
    dir: str = "checkpoints"
    """Directory of the checkpoints, relative to the run directory and inside it (`planc check` refuses one outside)."""
    keep: PositiveInt = 3
    """How many of the newest checkpoints to keep; older ones are deleted after a save succeeds."""
    resume: Flag = True
    """Resume from the newest complete checkpoint in dir when one exists."""
    max_restarts: NonNegativeInt = DEFAULT_MAX_RESTARTS
    """Times torchrun restarts every process after one fails or hangs; each restart resumes from the newest
    complete checkpoint (`planc run --max-restarts` overrides)."""
    stop_deadline: Seconds = Field(default=DEFAULT_STOP_DEADLINE, gt=0)
    """After SIGTERM or Ctrl-C: time to finish the step in flight and save; a process still busy then is
    killed (torchrun's TORCH_ELASTIC_SHUTDOWN_TIMEOUT; torch 2.11's torchrun kills at 30 s)."""
    async_save: Flag = False
    """Write checkpoints in the background (dcp.async_save): a save stalls training only for a copy of the
    state; the checkpoint is published once every rank has written it."""
