"""Run directories and launching the emitted program under torchrun.

A run directory holds ``plan.json`` (the validated plan, the chosen layout and the prediction),
``train.py`` (the emitted program), ``metrics.jsonl`` (one JSON object per step), ``events.jsonl``,
``heartbeats/`` and ``checkpoints/`` (see :mod:`planc.rundir`). Launching it again with the same
directory resumes from the newest complete checkpoint. torchrun restarts the workers after a
failure (``--max-restarts``) and gives them the plan's stop deadline to save on SIGTERM
(``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``); :mod:`planc.supervise` watches torchrun itself.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from planc.codegen import CompiledPlan
from planc.codegen.emit import (
    FIXED_SHUTDOWN_TIMEOUT_S,
    RENDEZVOUS_PORT,
    launch_env,
    launch_env_prefix,
    resilience_flags,
    shutdown_timeout,
)
from planc.codegen.quoting import inert_text
from planc.errors import PlanError
from planc.fileio import write_text_atomically  # noqa: F401  (re-exported for commands)
from planc.spec.checkpoint import DEFAULT_STOP_DEADLINE

PROGRAM = "train.py"


def default_run_dir(plan_path: Path) -> Path:
    """``runs/<plan name>-<YYYYmmdd-HHMMSS>`` under the current directory."""
    return Path("runs") / f"{plan_path.stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def write_run_dir(run_dir: Path, compiled: CompiledPlan) -> None:
    """Create (or refresh) a run directory with ``plan.json`` and ``train.py``."""
    if run_dir.exists() and not run_dir.is_dir():
        raise PlanError(f"--out {run_dir} exists and is not a directory", hint="choose another run directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    source = compiled.plan.source
    record = {
        # where the plan file is, whatever directory a later `planc doctor` runs from
        "plan_file": str(Path(source).resolve()) if source else None,
        "plan": compiled.plan.model_dump(mode="json"),
        "layout": compiled.layout.model_dump(mode="json"),
        "strategies": [s.name for s in compiled.strategies],
        "prediction": {
            "memory_bytes": compiled.prediction.memory_bytes,
            "capacity_bytes": compiled.prediction.capacity_bytes,
            "step_s": compiled.prediction.step_s,
            "tokens_per_s": compiled.prediction.tokens_per_s,
        },
    }
    write_text_atomically(run_dir / "plan.json", json.dumps(record, indent=2) + "\n")
    write_text_atomically(run_dir / PROGRAM, compiled.program)


def max_restarts_of(plan, override: int | None = None) -> int:
    """Restarts torchrun may make: ``--max-restarts``, else the checkpoint block's (none without one:
    a restart would start over)."""
    if override is not None:
        return override
    return plan.checkpoint.max_restarts if plan.checkpoint is not None else 0


def torchrun_argv(compiled: CompiledPlan, *, steps: int | None, max_restarts: int = 0) -> list[str]:
    """The local single-node launch: this Python's torchrun (through planc's wrapper, which reports a
    failed rank in one line), the plan's processes per node."""
    argv = [
        sys.executable,
        "-m",
        "planc.runtime.torchrun",
        "--standalone",
        "--nproc-per-node",
        str(compiled.plan.hardware.per_node),
        *resilience_flags(compiled.plan, max_restarts),
        PROGRAM,
        "--out",
        ".",
    ]
    if steps is not None:
        argv += ["--steps", str(steps)]
    return argv


def _flags_text(compiled: CompiledPlan, max_restarts: int) -> str:
    return "".join(f" {flag}" for flag in resilience_flags(compiled.plan, max_restarts))


def local_command(compiled: CompiledPlan, run_dir: Path, *, steps: int | None, max_restarts: int = 0) -> str:
    """The single-node launch as a user would type it."""
    extra = f" --steps {steps}" if steps is not None else ""
    env = launch_env_prefix(compiled.plan, max_restarts)
    return (
        f"cd {shlex.quote(str(run_dir))} && {env}torchrun --standalone --nproc-per-node "
        f"{compiled.plan.hardware.per_node}{_flags_text(compiled, max_restarts)} {PROGRAM} --out .{extra}"
    )


def multi_node_commands(
    compiled: CompiledPlan, run_dir: Path, *, steps: int | None, max_restarts: int = 0
) -> list[str]:
    """One shell command per node: torchrun with a c10d rendezvous on node 0 ($MASTER_ADDR).

    ``--rdzv-id``: the run's own id, the same on every node. torchrun's default ("none") is shared by
    every job, so a second run meeting at the same endpoint (a re-launch while the old agents are
    still up, another run's nodes) would join this one's rendezvous."""
    hw = compiled.plan.hardware
    extra = f" --steps {steps}" if steps is not None else ""
    env = launch_env_prefix(compiled.plan, max_restarts)
    run_id = shlex.quote(rendezvous_id(run_dir))
    return [
        f"cd {shlex.quote(str(run_dir))} && {env}torchrun --nnodes {hw.nodes} "
        f"--nproc-per-node {hw.per_node} "
        f"--node-rank {node} --rdzv-id {run_id} --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:{RENDEZVOUS_PORT}"
        f"{_flags_text(compiled, max_restarts)} {PROGRAM} --out .{extra}"
        for node in range(hw.nodes)
    ]


def rendezvous_id(run_dir: Path) -> str:
    """A rendezvous id for the run in ``run_dir``: its folder's name and a digest of its absolute
    path, so two runs whose folders share a name (``runs/a/out``, ``runs/b/out``) do not meet."""
    here = run_dir.resolve()
    digest = hashlib.sha256(str(here).encode()).hexdigest()[:12]
    return f"planc-{here.name}-{digest}"


#: Seconds between Slurm's early SIGTERM and the time limit beyond torchrun's grace period (the stop
#: deadline + 5 s, :func:`shutdown_timeout`): for torchrun and srun to exit after the workers.
SLURM_SIGNAL_MARGIN_S = 30


def slurm_script(compiled: CompiledPlan, run_dir: Path, *, steps: int | None, max_restarts: int = 0) -> str:
    """An sbatch script: one task per node, each running planc's torchrun wrapper against node 0's rendezvous.

    * ``srun --cpus-per-task``: every core of the (exclusive) node for the task. A step gets only the
      CPUs it asks for (one by default, and since Slurm 22.05 srun no longer inherits sbatch's
      ``--cpus-per-task``), so torchrun and all its workers would share one core where the cluster
      confines tasks to their cores.
    * ``--signal=TERM@N``: SIGTERM N s before the time limit, N covering the stop deadline and
      torchrun's grace period, so the stop checkpoint is written; at the limit itself Slurm allows only
      KillWait (30 s by default) between SIGTERM and SIGKILL.
    * the environment `planc run` gives a local launch: ``PLANC_RUN_DIR`` (the wrapper's failure
      records), and on GPUs NCCL's flight-recorder dump on a collective timeout.
    """
    hw = compiled.plan.hardware
    name = inert_text(compiled.plan.model.name or "planc", 40).replace(" ", "_").replace("'", "")
    extra = f" --steps {steps}" if steps is not None else ""
    gres = "" if hw.device == "cpu" else f"#SBATCH --gpus-per-node={hw.per_node}\n"
    here = run_dir.resolve()
    env = {**launch_env(compiled.plan, max_restarts), **run_env(here, max_restarts)}
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in env.items())
    spec = compiled.plan.checkpoint
    deadline = spec.stop_deadline if spec is not None else DEFAULT_STOP_DEADLINE
    grace = shutdown_timeout(compiled.plan) or math.ceil(deadline) + 5  # torchrun's, as `planc run` sets it
    return f"""#!/bin/bash
#SBATCH --job-name=planc-{name}
#SBATCH --nodes={hw.nodes}
#SBATCH --ntasks-per-node=1
{gres}#SBATCH --exclusive
#SBATCH --signal=TERM@{grace + SLURM_SIGNAL_MARGIN_S}
# Generated by planc: {hw.nodes} node(s) x {hw.per_node} process(es), layout {compiled.layout.describe()}.
# SIGTERM {grace + SLURM_SIGNAL_MARGIN_S} s before the time limit: every rank finishes its step and saves (stop
# deadline {deadline:g} s). scancel and preemption allow only the cluster's KillWait/GraceTime before SIGKILL.
set -euo pipefail
cd {shlex.quote(str(here))}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
{exports}srun --cpus-per-task="$SLURM_CPUS_ON_NODE" python -m planc.runtime.torchrun \\
    --nnodes {hw.nodes} --nproc-per-node {hw.per_node} \\
    --rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:{RENDEZVOUS_PORT}" \\
   {_flags_text(compiled, max_restarts)} {PROGRAM} --out .{extra}
"""


def run_env(run_dir: Path, max_restarts: int) -> dict[str, str]:
    """What every launch of ``run_dir`` exports besides torchrun's own settings (:func:`launch_env`,
    which carries NCCL's flight-recorder dump on GPUs): the run directory and restart budget for
    planc's torchrun wrapper."""
    return {"PLANC_RUN_DIR": str(run_dir), "PLANC_MAX_RESTARTS": str(max_restarts)}


def under_torchrun() -> bool:
    """True inside a process that torchrun (or another launcher setting RANK/WORLD_SIZE) started."""
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def check_local_devices(compiled: CompiledPlan) -> None:
    """Refuse early, with a clear message, when this machine cannot host the plan's node."""
    hw = compiled.plan.hardware
    if hw.device == "cpu":
        return
    import torch

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if available < hw.per_node:
        raise PlanError(
            f"the plan runs {hw.per_node} processes per node on {hw.device} GPUs, but this machine has "
            f"{available} CUDA device(s)",
            hint="run it where the GPUs are (planc run prints the commands for multi-node plans), "
            'or try the plan on CPU processes with device = "cpu"',
        )


def cpu_sharing_note(plan, cores: int) -> str | None:
    """What to expect when a CPU plan starts more processes than this machine has cores and no
    profile measured it (None otherwise). The ``cpu`` preset gives every process a few cores' worth
    of compute; processes that take turns on fewer cores run each step several times slower than
    that (``plans/cpu-3d.plan``, 8 processes on 2 cores: 0.78 s per step measured against 0.024
    predicted). A profile measured with as many processes on the same cores
    (``planc calibrate --cpu --nproc N``) carries the sharing."""
    processes = plan.hardware.per_node
    if plan.hardware.device != "cpu" or plan.hardware.profile is not None or processes <= cores:
        return None
    return (
        f"{processes} processes share this machine's {cores} core(s), and the uncalibrated prediction gives "
        "each one a few cores: expect steps several times slower than predicted. For a prediction of this "
        f"machine, run `planc calibrate --cpu --nproc {processes} --plan FILE --out cpu.json` here (the same "
        'processes on the same cores) and name it in the plan: hardware { profile = "cpu.json" }'
    )


def launch_local(compiled: CompiledPlan, run_dir: Path, *, steps: int | None, max_restarts: int = 0):
    """Run torchrun in ``run_dir`` under :class:`planc.supervise.Supervisor` and wait; returns its
    :class:`~planc.supervise.Outcome`. A torchrun killed from outside is started again while restarts remain."""
    from planc.rundir.events import read_events, record_event
    from planc.supervise import Supervisor

    plan = compiled.plan
    ours = run_env(run_dir.resolve(), max_restarts)
    env = dict(os.environ)
    env.update({key: env.get(key, value) for key, value in {**launch_env(plan, max_restarts), **ours}.items()})
    env.update({key: ours[key] for key in ("PLANC_RUN_DIR", "PLANC_MAX_RESTARTS")})  # this run's, always
    _warn_if_torchrun_kills_sooner(plan)
    note = cpu_sharing_note(plan, os.cpu_count() or 1)
    if note:
        print(f"planc: note: {note}", file=sys.stderr, flush=True)
    if plan.hardware.device == "cpu":
        # Share the cores between the processes instead of oversubscribing them (torchrun's default
        # of 1 thread also works, but says so with a warning on every launch).
        threads = max(1, (os.cpu_count() or 1) // plan.hardware.per_node)
        env.setdefault("OMP_NUM_THREADS", str(threads))
    deadline = plan.checkpoint.stop_deadline if plan.checkpoint is not None else DEFAULT_STOP_DEADLINE
    began, left = time.time(), max_restarts
    while True:
        attempts = [e for e in read_events(run_dir) if e["event"] == "attempt" and e["time"] >= began]
        env["PLANC_ATTEMPT_BASE"] = str(max((e.get("attempt", 0) for e in attempts), default=-1) + 1)
        argv = torchrun_argv(compiled, steps=steps, max_restarts=left)
        outcome = Supervisor(argv, cwd=run_dir, env=env, deadline=deadline).run()
        if outcome.stop_signal is not None or outcome.status >= 0:
            return outcome
        attempts = [e for e in read_events(run_dir) if e["event"] == "attempt" and e["time"] >= began]
        left = max_restarts - max(0, len(attempts) - 1) - 1  # this relaunch is a restart too
        if left < 0:
            return outcome
        name = signal.Signals(-outcome.status).name
        print(f"planc: torchrun was killed by {name}; its workers stopped; starting it again", file=sys.stderr)
        record_event(run_dir, "agent_lost", signal=name)


def _warn_if_torchrun_kills_sooner(plan) -> None:
    """An older torchrun (before torch 2.12) kills the workers a fixed 30 s after a stop signal."""
    timeout = shutdown_timeout(plan)
    if timeout is None or timeout <= FIXED_SHUTDOWN_TIMEOUT_S:
        return
    from torch.distributed.launcher.api import LaunchConfig

    if "shutdown_timeout" not in LaunchConfig.__dataclass_fields__:
        import torch

        print(
            f"planc: warning: torch {torch.__version__}'s torchrun kills the workers {FIXED_SHUTDOWN_TIMEOUT_S} s "
            f"after a stop signal, before the plan's stop deadline of {plan.checkpoint.stop_deadline:g} s: a stop "
            "checkpoint that "
            "takes longer is cut off (the newest complete one stays); torch 2.12 or newer honours the deadline",
            file=sys.stderr,
        )


def last_metrics(run_dir: Path) -> list[dict]:
    """The records of ``metrics.jsonl`` (a torn last line from a crash is skipped)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
