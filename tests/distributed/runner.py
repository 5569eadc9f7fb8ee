"""The ranks' side of the equivalence tests: train each case and report its per-step losses.

    run_ranks("tests/distributed/runner.py:run_cases", N, cases)      (tests/ranks.py)

``cases`` is a list of ``{"name", "plan" (Plan JSON), "layout" (Layout fields), "steps"}``;
every case must have ``tp x pp x dp = N``. Each case builds its own job (and device mesh) through
:func:`planc.runtime.compose.compose` -- the registry's active strategies in composition order --
and trains it. The answer is ``{name: {"losses": [...], "grad_norms": [...], "seconds": s}}``,
or ``{"error": "..."}`` for a case that raised (the others still run).
"""

from __future__ import annotations

import time
import traceback

import torch.distributed as dist

from planc.runtime.compose import compose
from planc.runtime.loop import train
from planc.spec import Layout, Plan
from planc.strategies.registry import load_registry

#: Loaded once, at the top, as a planc command does.
REGISTRY = load_registry()


def run_case(case: dict) -> dict:
    """Train the case; with ``resume_at`` k, stop after step k (checkpointing into ``out_dir``), then
    build a fresh job -- new mesh, new model -- that resumes from the checkpoint and finishes."""
    plan = Plan.model_validate(case["plan"])
    layout = Layout(**case["layout"])
    began = time.perf_counter()
    job = compose(plan, layout, REGISTRY)
    facts = gather_facts(job)
    if plan.train.precision == "bf16" and layout.pp == 1 and layout.tp == 1:
        facts["saved"] = saved_activations(job)
    resume_at = case.get("resume_at")
    if resume_at is None:
        records = train(job, steps=case["steps"], quiet=True)
    else:
        records = train(job, steps=resume_at, out_dir=case["out_dir"], quiet=True)
        del job
        resumed = compose(plan, layout, REGISTRY)
        records += train(resumed, steps=case["steps"], out_dir=case["out_dir"], quiet=True)
    return {
        "losses": [r["loss"] for r in records],
        "grad_norms": [r["grad_norm"] for r in records],
        "val_losses": {r["step"]: r["val_loss"] for r in records if "val_loss" in r},
        "seconds": time.perf_counter() - began,
        "facts": facts,
    }


def gather_facts(job) -> dict:
    """What the composition built on this rank (rank 0 reports it): evidence each strategy really applied."""
    from torch.distributed._composable.replicate_with_fsdp import ReplicateModule
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    parts = job.unwrapped_parts()
    wrappers = [m for part in parts for m in part.modules() if isinstance(m, CheckpointWrapper)]
    selective = [w for w in wrappers if w.checkpoint_fn.keywords.get("context_fn") is not None]
    return {
        "part_types": sorted({type(p).__name__ for p in job.model_parts}),
        "fsdp": any(
            isinstance(m, FSDPModule) and not isinstance(m, ReplicateModule) for part in parts for m in part.modules()
        ),
        "fsdp_mesh": next(
            (
                list(m._get_fsdp_state()._fsdp_param_group.mesh_info.mesh.mesh_dim_names)
                for part in parts
                for m in part.modules()
                if isinstance(m, FSDPModule)
                and not isinstance(m, ReplicateModule)
                # a unit with no parameters of its own (e.g. a later pipeline stage's root) has no group
                and m._get_fsdp_state()._fsdp_param_group is not None
            ),
            None,
        ),
        "replicate": any(isinstance(m, ReplicateModule) for part in parts for m in part.modules()),
        "stages": job.stage_indices,
        "schedule": type(job.schedule).__name__ if job.schedule is not None else None,
        "layers": sum(len(part.layers) for part in parts),
        "checkpointed_blocks": len(wrappers),
        "selective_blocks": len(selective),
        "dtensor_params": sum(isinstance(p, DTensor) for p in job.local_parameters),
        "local_shards": len(job.local_shard_specs),
        "optimizer": type(job.optimizers[0]).__name__,
        "autocast": str(job.autocast_dtype) if job.autocast_dtype is not None else None,
        "mp_policy": job.mp_policy is not None,
        "loss_parallel": job.loss_parallel,
        "tied_copies": len(job.tied_weights),
    }


def saved_activations(job) -> dict:
    """What autograd saves for backward in one forward of a micro-batch (then backward, and the
    gradients dropped before training starts): bytes per floating dtype, and the dtypes of the saved
    tensors shaped like the residual stream ``[micro_batch, seq_len, hidden]``."""
    import torch

    spec, batch = job.plan.model, job.layout.micro_batch
    stream = (batch, spec.seq_len, spec.hidden)
    by_dtype: dict[str, int] = {}
    residual: set[str] = set()

    def pack(tensor):
        if tensor.is_floating_point():
            name = str(tensor.dtype).removeprefix("torch.")
            by_dtype[name] = by_dtype.get(name, 0) + tensor.numel() * tensor.element_size()
            if tuple(tensor.shape) == stream:
                residual.add(name)
        return tensor

    tokens = torch.randint(0, spec.vocab, (batch, spec.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = job.model_parts[0](tokens.to(job.device))
    logits.float().mean().backward()
    for param in job.local_parameters:
        param.grad = None
    return {"bytes": by_dtype, "residual_stream": sorted(residual)}


def run_cases(cases: list[dict]) -> dict:
    """Every case in turn on this rank; a case that raises is reported and the others still run."""
    results = {}
    for case in cases:
        try:
            results[case["name"]] = run_case(case)
        except Exception as exc:  # report and go on: one broken case must not hide the others
            results[case["name"]] = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
            print(f"[rank {dist.get_rank()}] case {case['name']} failed: {results[case['name']]['error']}", flush=True)
        dist.barrier()
    return results
