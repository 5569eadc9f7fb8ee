"""The one way the tests (and ``bench/activation_memory.py``) run code on several ranks.

    result = run_ranks("tests/runtime/test_x.py:check", world=2, payload={...})

starts ``torchrun --standalone --nproc-per-node WORLD`` on this file; every rank joins the default
gloo process group from torchrun's environment, loads ``check`` from its file, calls
``check(payload)`` and rank 0's return value (JSON) comes back. A rank that raises fails the launch,
and ``run_ranks`` raises with the ranks' output. A launch costs seconds, so callers put many
checks into one (the equivalence matrix runs every case of a world size in one launch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


class RanksFailed(RuntimeError):
    """A launch that did not finish: its exit status and the tail of its output."""


def run_ranks(target: str, world: int, payload: Any = None, *, timeout: float = 300) -> Any:
    """Run ``target`` ("path/to/file.py:function", relative to the repository) on ``world`` gloo
    ranks under torchrun; rank 0's return value."""
    with tempfile.TemporaryDirectory() as folder:
        payload_path, result_path = Path(folder) / "payload.json", Path(folder) / "result.json"
        payload_path.write_text(json.dumps(payload))
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(world),
            str(Path(__file__).resolve()),
            target,
            str(payload_path),
            str(result_path),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
        except subprocess.TimeoutExpired as exc:
            raise RanksFailed(f"{target} on {world} ranks timed out after {timeout} s:\n{_tail(exc.stderr)}") from None
        if done.returncode != 0 or not result_path.exists():
            raise RanksFailed(f"{target} on {world} ranks failed (exit {done.returncode}):\n{_tail(done.stderr)}")
        return json.loads(result_path.read_text())


def _tail(text: str | bytes | None, size: int = 6000) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-size:]


def _load(target: str):
    """The function ``target`` names: "path/to/file.py:function"."""
    import importlib.util

    path, function = target.rsplit(":", 1)
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # so that pickling and dataclasses inside it find it
    spec.loader.exec_module(module)
    return getattr(module, function)


def _worker(target: str, payload_path: str, result_path: str) -> None:
    """One rank: join the group, run the target, rank 0 writes the result; leave cleanly."""
    import faulthandler

    import torch
    import torch.distributed as dist

    faulthandler.enable(all_threads=True)  # a crash in C++ (SIGABRT, SIGSEGV) shows the Python stacks
    torch.set_num_threads(1)  # N processes share few cores; more threads each only contend
    sys.path.insert(0, str(ROOT / "tests"))
    dist.init_process_group("gloo")
    result = _load(target)(json.loads(Path(payload_path).read_text()))
    if dist.is_initialized():  # the target may have shut the group down itself
        if dist.get_rank() == 0:
            Path(result_path).write_text(json.dumps(result))
        dist.barrier()
        dist.destroy_process_group()
    elif int(os.environ.get("RANK", "0")) == 0:
        Path(result_path).write_text(json.dumps(result))
    # Passed: leave without interpreter finalization. About one launch in 30 aborted *after* this
    # point ("terminate called without an active exception", no Python frame left: a C++ thread
    # destroyed while joinable during static destruction), failing a run whose checks had all
    # passed. A failure above still raises, and torchrun reports it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _worker(*sys.argv[1:4])
