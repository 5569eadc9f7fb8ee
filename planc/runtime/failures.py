"""One clear line per rank when a step fails for a reason the user can act on.

Two failures are common and their tracebacks say little to the person running the job: a peer
process died (every surviving rank then fails inside a collective), and the device ran out of
memory. :func:`describe_failure` turns them into a sentence; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import re

#: Substrings of the errors gloo and NCCL raise when the other end of a collective is gone.
PEER_LOST_SIGNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Connection refused",
    "NCCL communicator was aborted",
    "remote process exited",
    "Socket Timeout",
)


def describe_failure(exc: BaseException, *, rank: int, step: int, printed: bool = True) -> str | None:
    """A one-line explanation of ``exc`` raised during ``step`` on ``rank``, or None if it is not
    one planc can explain (then the traceback is the right report).

    ``printed``: the line goes to the rank's stderr, where the lost peer's own message, if it wrote
    one, came first, and the line says so. False for the heartbeat's copy, which ``planc doctor``
    lists among every rank's messages, where "above" would point nowhere."""
    import torch

    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    # gloo prefixes its source location ("[/path/pair.cc:553] "): keep the sentence, not the path.
    first_line = re.sub(r"^\[[^\]]*\]\s*", "", first_line).split(". This is typically")[0][:200]
    if isinstance(exc, torch.OutOfMemoryError):
        return (
            f"rank {rank}: out of device memory in step {step}: {first_line}. "
            "Run `planc explain` on the plan to see the predicted memory; lower the micro-batch, "
            "add recompute, or raise the ZeRO stage"
        )
    if _peer_lost(exc):
        pointer = "; its own message, if any, is above" if printed else ""
        return (
            f"rank {rank}: lost contact with another rank in step {step} (a peer process crashed or was "
            f"killed{pointer}): {first_line}"
        )
    return None


def _peer_lost(exc: BaseException) -> bool:
    import torch.distributed as dist

    if isinstance(exc, getattr(dist, "DistNetworkError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(sign in text for sign in PEER_LOST_SIGNS)
