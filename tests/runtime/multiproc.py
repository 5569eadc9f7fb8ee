"""Run a function in N CPU processes joined by a gloo process group (torch.multiprocessing.spawn).

Cheaper than a torchrun launch for unit tests; an exception in any rank fails the test with that
rank's traceback.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, fn: Callable[..., Any], world_size: int, init_file: str, args: tuple) -> None:
    import faulthandler

    import torch

    faulthandler.enable(all_threads=True)  # a crash in C++ (SIGABRT, SIGSEGV) shows the Python stacks
    torch.set_num_threads(1)  # N processes share few cores; more threads each only contend
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Passed: leave without interpreter finalization. About one spawn in 30 aborted *after* this
    # point ("terminate called without an active exception", no Python frame left: a C++ thread
    # destroyed while joinable during static destruction), failing a test whose checks had all
    # passed. A failure above still raises, and spawn reports it with the rank's traceback.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_gloo(fn: Callable[..., Any], world_size: int, *args: Any) -> None:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` processes; ``fn`` must be module-level."""
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "pg-init")
        mp.spawn(_entry, args=(fn, world_size, init_file, args), nprocs=world_size, join=True)
