"""Opening a run's training and validation data on every rank, the same data everywhere.

Every rank opens the files itself (each node may have its own copy), then all ranks compare what
they found with one all-reduce: if any rank cannot open its data, or two ranks see files of
different lengths, every rank stops before the first step -- the ranks that failed say why,
naming their host -- instead of some ranks training on other batches or waiting forever in a
collective. Rank 0 records the resolved paths in ``RUN_DIR/data.json``.

Paths: ``--data`` / ``--val-data`` (relative to the working directory) replace the plan's;
otherwise a relative plan path resolves against ``--data-root`` or the plan's ``data_root``
(its directory when it was checked). See :mod:`planc.data.paths`.
"""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from planc.runtime.data import DataError, DataSource, build_source


@dataclass
class RunData:
    train: DataSource
    validation: DataSource | None


def open_run_data(
    job,
    *,
    data: str | None = None,
    val_data: str | None = None,
    data_root: str | Path | None = None,
    out_dir: str | Path | None = None,
) -> RunData:
    """The training and validation sources of ``job``'s plan (with overrides), agreed on by every rank."""
    plan = job.plan
    root = data_root if data_root is not None else plan.data_root
    wanted = {
        "train.data": (data, None) if data is not None else (plan.train.data, root),
        "train.val_data": (val_data, None) if val_data is not None else (plan.train.val_data, root),
    }
    sources: dict[str, DataSource | None] = {}
    failure = None
    for key, (text, base) in wanted.items():
        if text is None:
            sources[key] = None
            continue
        try:
            sources[key] = build_source(
                text, plan.model, global_batch=plan.train.global_batch, seed=plan.train.seed, root=base, key=key
            )
        except DataError as exc:
            failure = failure or str(exc)
            sources[key] = None
    _agree(job, failure, [_length(sources["train.data"]), _length(sources["train.val_data"])])
    train = sources["train.data"]
    assert train is not None  # train.data always names a source (default: synthetic); failures exited above
    run_data = RunData(train=train, validation=sources["train.val_data"])
    if out_dir is not None and dist.get_rank() == 0:
        from planc.fileio import write_text_atomically

        record = {key: source.describe() for key, source in sources.items() if source is not None}
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        write_text_atomically(Path(out_dir) / "data.json", json.dumps(record, indent=2) + "\n")
    return run_data


def _length(source: DataSource | None) -> int:
    """Windows of a file source (-1 for none, 0 for synthetic data, which has no length)."""
    return -1 if source is None else int(getattr(source, "windows", 0))


def _agree(job, failure: str | None, lengths: list[int]) -> None:
    """Stop every rank when any rank failed or the ranks' files differ in length (one all-reduce of MAX)."""
    values = [1.0 if failure else 0.0] + [v for length in lengths for v in (float(length), float(-length))]
    found = torch.tensor(values, dtype=torch.float64, device=job.device)
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    failed = found[0].item() > 0
    differ = [
        key
        for key, (high, low) in zip(("train.data", "train.val_data"), found[1:].view(-1, 2).tolist())
        if high != -low
    ]
    if not failed and not differ:
        return
    rank = dist.get_rank()
    if failure:
        print(f"rank {rank} on {socket.gethostname()}: {failure}", file=sys.stderr, flush=True)
    elif not failed and rank == 0:
        print(
            f"{' and '.join(differ)} differ between ranks (other nodes see files of another length); "
            "every node must read the same data: use a shared filesystem or copy the same files",
            file=sys.stderr,
            flush=True,
        )
    raise SystemExit(1)
