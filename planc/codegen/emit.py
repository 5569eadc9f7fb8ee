"""Write the training program for a plan and its chosen layout.

The program reads like nanoGPT: a docstring with the exact torchrun command and the prediction,
the plan and layout as plain data, then mesh -> model -> each strategy's ``apply`` in composition
order -> init -> optimizer -> loop. It imports planc's runtime and strategies, never its CLI.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from planc import __version__
from planc.codegen.quoting import identifier_for, inert_text, keyword_arguments, python_literal
from planc.rundir.flight_recorder import DIRECTORY as FLIGHT_RECORDER_DIR
from planc.spec import Layout, Plan
from planc.units import format_bytes

#: The order the built-ins compose in, and why; printed above the strategy calls.
COMPOSITION_COMMENT = """\
    # Strategies, in composition order: pipeline split -> tensor parallel -> recompute ->
    # precision -> data parallel. Each wraps PyTorch's own implementation; bf16 comes before
    # FSDP because FSDP2 takes its mixed-precision policy when it wraps the model."""


@dataclass(frozen=True)
class StrategyCall:
    """One active strategy as the program spells it."""

    name: str
    module: str
    builtin: bool
    description: str
    options: dict[str, Any]


@dataclass(frozen=True)
class Prediction:
    """The planner's numbers the docstring quotes, with explain's words about them."""

    memory_bytes: float
    capacity_bytes: float
    step_s: float
    tokens_per_s: float
    step_band: str = ""
    """The step time's uncertainty as explain prints it: ``"±9%"`` or ``"(uncalibrated)"``
    (:func:`planc.explain.totals.band_text`); empty when unknown."""
    step_uncertainty: float | None = None
    """The number ``step_band`` says in words (:func:`planc.cost.uncertainty.step_time_uncertainty`:
    relative, None when uncalibrated), for code that reads the band; meaningful when step_band is set."""
    memory_warning: str = ""
    """Explain's warning when memory is close to the limit (:func:`planc.planner.advice.close_to_limit`
    in :func:`planc.explain.advice_words.advice_text`'s words); empty when there is none."""
    steady_after: int = 0
    """Steps a strategy runs before it works as priced (its ``steady_after``: PowerSGD's
    uncompressed start); the prediction describes the steps after them."""

    def numbers(self) -> dict[str, Any]:
        """The program's ``PREDICTED``, which training logs beside each measured step; `planc run` under
        torchrun, which trains in place, passes the same (the progress line reads its band)."""
        numbers: dict[str, Any] = {
            "memory_bytes": round(self.memory_bytes),
            "capacity_bytes": round(self.capacity_bytes),
            "step_s": float(f"{self.step_s:.4g}"),
            "tokens_per_s": round(self.tokens_per_s),
            "step_band": self.step_band,
        }
        if self.step_band:  # the band's number, which the progress line reads (not the words)
            numbers["step_uncertainty"] = self.step_uncertainty
        if self.steady_after:  # only where a strategy has such steps: other programs stay as they were
            numbers["steady_after"] = self.steady_after
        return numbers


def resilience_flags(plan: Plan, max_restarts: int) -> list[str]:
    """torchrun's restart option for ``plan`` (none when it is torchrun's default)."""
    return ["--max-restarts", str(max_restarts)] if max_restarts else []


#: With restarts, the workers must not share the rendezvous' TCPStore: a restarted group would read the
#: previous group's addresses from it and fail to connect (pytorch/pytorch#135712; seen here with gloo).
RESTART_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}

#: torchrun's grace period between forwarding a stop signal and killing the workers. An environment
#: variable, not the ``--shutdown-timeout`` flag: torch 2.12 added both, and an older torchrun (2.11,
#: seen on a GPU machine) refuses the flag but ignores the variable, keeping its fixed 30 s.
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
#: What a torchrun without the setting waits (torch 2.11's ``LocalElasticAgent``).
FIXED_SHUTDOWN_TIMEOUT_S = 30


def shutdown_timeout(plan: Plan) -> int | None:
    """torchrun's grace period for ``plan``: the stop deadline plus 5 s, so the workers' own watchdog,
    which fires at the deadline, acts first (None without a checkpoint block: torchrun's default)."""
    if plan.checkpoint is None:
        return None
    return math.ceil(plan.checkpoint.stop_deadline) + 5


#: On CUDA: when NCCL's watchdog aborts a rank on a collective timeout, each rank first dumps its
#: flight record into the run directory (relative: torchrun and its ranks run there), which the
#: launcher reads to name the rank that did not arrive (planc/rundir/flight_recorder.py).
FLIGHT_RECORDER_ENV = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": f"{FLIGHT_RECORDER_DIR}/rank-"}


def launch_env(plan: Plan, max_restarts: int) -> dict[str, str]:
    """The environment torchrun needs for ``plan`` beyond its flags (every launch carries it: `planc
    run`, the multi-node commands, the Slurm script, the program's docstring)."""
    env = dict(RESTART_ENV) if max_restarts else {}
    timeout = shutdown_timeout(plan)
    if timeout is not None:
        env[SHUTDOWN_TIMEOUT_ENV] = str(timeout)
    if not plan.hardware.is_cpu:
        env.update(FLIGHT_RECORDER_ENV)
    return env


def launch_env_prefix(plan: Plan, max_restarts: int) -> str:
    """``VAR=value `` assignments to put before torchrun."""
    return "".join(f"{key}={value} " for key, value in launch_env(plan, max_restarts).items())


#: The port of a multi-node run's c10d rendezvous on its first node ($MASTER_ADDR): torchrun's default.
RENDEZVOUS_PORT = 29500


def torchrun_command(plan: Plan, program: str = "train.py") -> str:
    """The command that launches ``program`` for this plan's world (on every node when multi-node,
    with ``$MASTER_ADDR`` the first node's address and ``$RUN_ID`` one id every node shares:
    ``planc run`` prints the commands with an id filled in)."""
    hw = plan.hardware
    restarts = plan.checkpoint.max_restarts if plan.checkpoint is not None else 0
    flags = "".join(f" {flag}" for flag in resilience_flags(plan, restarts))
    env = launch_env_prefix(plan, restarts)
    if hw.nodes == 1:
        return f"{env}torchrun --standalone --nproc-per-node {hw.per_node}{flags} {program}"
    return (
        f"{env}torchrun --nnodes {hw.nodes} --nproc-per-node {hw.per_node} --rdzv-id $RUN_ID --rdzv-backend c10d "
        f"--rdzv-endpoint $MASTER_ADDR:{RENDEZVOUS_PORT}{flags} {program}"
    )


def emit_program(
    plan: Plan,
    layout: Layout,
    strategies: Sequence[StrategyCall],
    *,
    prediction: Prediction | None = None,
    program_name: str = "train.py",
) -> str:
    """The text of a runnable training program (see the module docstring)."""
    program_name = inert_text(program_name, limit=80)
    taken: set[str] = {
        "job",
        "args",
        "parser",
        "main",
        "train",
        "shutdown",
        "Job",
        "Plan",
        "Layout",
        "PLAN",
        "LAYOUT",
        "PREDICTED",
        "argparse",
        "load_registry",
        "format_bytes",
        "load_strategy",
    }
    builtin_imports, plugin_lines, apply_lines = [], [], []
    for call in strategies:
        if call.builtin:
            variable = call.module.rsplit(".", 1)[-1]
            taken.add(variable)
            builtin_imports.append(variable)
        else:
            variable = identifier_for(call.name, taken)
            plugin_lines.append(f"{variable} = load_strategy({call.name!r})")
        # A plugin's options class is the registry's (a plugin may declare no Options: the
        # registry's empty model stands in for it, as it did at plan time).
        options_class = "Options" if call.builtin else "options_model"
        apply_lines.append(f"    # {inert_text(call.name, 40)}: {inert_text(call.description, 90)}")
        apply_lines.append(f"    {variable}.apply(job, {variable}.{options_class}({keyword_arguments(call.options)}))")

    imports = [
        "import argparse",
        "",
        "from planc.runtime.job import Job",
        "from planc.runtime.loop import leave, shutdown, train",
        "from planc.spec import Layout, Plan",
    ]
    if builtin_imports:
        imports.append(f"from planc.strategies import {', '.join(sorted(builtin_imports))}")
    if prediction is not None:
        imports.append("from planc.units import format_bytes")
    if plugin_lines:
        imports.append("from planc.strategies.registry import load_strategy")
        plugin_block = (
            "\n# Third-party strategies come through the same entry-point registry planc planned with.\n"
            + "\n".join(plugin_lines)
            + "\n"
        )
    else:
        plugin_block = ""
    if not apply_lines:
        apply_lines = ["    # No strategy: one process trains the whole model."]
        composition = ""
    else:
        composition = COMPOSITION_COMMENT + "\n"

    plan_data = plan.model_dump(mode="json", exclude_computed_fields=True)
    if prediction is not None:
        numbers = prediction.numbers()
        prediction_block = (
            "\n# What planc predicted for this layout (`planc explain` shows how).\n"
            f"PREDICTED = {python_literal(numbers)}\n"
        )
        # Sizes in planc's units (MiB for a CPU run, not "0.03 GiB"), the step with explain's band.
        predicted_print = (
            "\n        print(f\"predicted: {format_bytes(PREDICTED['memory_bytes'])} per device of \"\n"
            "              f\"{format_bytes(PREDICTED['capacity_bytes'])}; \"\n"
            "              f\"step {PREDICTED['step_s']:.3g} s {PREDICTED['step_band']}\")"
        )
    else:
        prediction_block, predicted_print = "", ""
    predicted_argument = ", predicted=PREDICTED" if prediction is not None else ""
    # shard_group (HSDP) only when set: a plain-FSDP program reads as it did before HSDP existed.
    layout_data = layout.model_dump(mode="json", exclude={"shard_group"} if layout.shard_group is None else set())
    return f'''"""{_docstring(plan, layout, strategies, prediction, program_name)}"""

{chr(10).join(imports)}
{plugin_block}
# The validated plan, as plain data (`planc check --json` prints it with the derived values,
# such as the parameter count, which are recomputed here on load).
PLAN = Plan.model_validate(
    {python_literal(plan_data, indent=4)}
)

# The layout planc chose: every `auto` of the plan resolved.
LAYOUT = Layout({keyword_arguments(layout_data)})
{prediction_block}

def main() -> None:
    parser = argparse.ArgumentParser(description="Train the plan's model (run under torchrun).")
    parser.add_argument("--steps", type=int, default=PLAN.train.steps, help="optimizer steps to train")
    parser.add_argument("--out", default=".", help="run directory for metrics.jsonl and checkpoints")
    parser.add_argument("--data", help="training data, replacing the plan's train.data")
    parser.add_argument("--val-data", help="validation data, replacing the plan's train.val_data")
    parser.add_argument("--data-root", help="where the plan's relative data (and weights) paths are on this machine")
    parser.add_argument("--log", action="append", default=[], help="also log to this metrics sink (repeatable)")
    args = parser.parse_args()

    # Process group, the ("pp", "dp", "tp") device mesh, and the full model on the meta device.
    job = Job.create(PLAN, LAYOUT)
    if job.rank == 0:
        print(f"tokens per step: {{PLAN.tokens_per_step:,}}; parameters: {{PLAN.model.params:,}}; "
              f"micro-batches per rank: {{LAYOUT.grad_accumulation(PLAN.train.global_batch)}}"){predicted_print}

{composition}{chr(10).join(apply_lines)}

    {_init_lines(plan)}
    job.build_optimizer()
    # Every rank opens the data itself (relative paths under --data-root, else the plan's directory).
    try:
        train(job, steps=args.steps, out_dir=args.out, data=args.data, val_data=args.val_data,
              data_dir=args.data_root, log=args.log{predicted_argument})
    finally:
        shutdown()


if __name__ == "__main__":
    main()
    leave()  # status 0 without interpreter finalization, which can abort in C++ (see leave)
'''


def _init_lines(plan: Plan) -> str:
    """Where the starting weights come from (a comment, no user text in it) and the call that sets them."""
    if plan.model.init == "pretrained":
        return (
            "# Start from the Hugging Face weights in PLAN.model.weights (relative: under --data-root, else\n"
            "    # the plan's directory); each rank reads only its shards.\n"
            "    job.init_weights(data_root=args.data_root)"
        )
    return (
        "# Same starting weights on every layout: each parameter depends only on (seed, its name).\n"
        "    job.init_weights()"
    )


def _docstring(plan: Plan, layout: Layout, strategies, prediction, program_name: str) -> str:
    m, hw = plan.model, plan.hardware
    name = inert_text(m.name or "model", 60)
    source = inert_text(plan.source or "a plan", 100)
    accumulation = layout.grad_accumulation(plan.train.global_batch)
    lines = [
        f"{name}: a training program generated by planc {__version__} from {source}.",
        "",
        "Run it with:",
        "",
        f"    {torchrun_command(plan, program_name)}",
        "",
        f"Model       {m.params:,} parameters, {m.layers} layers, hidden {m.hidden}, sequence {m.seq_len}",
        f"Hardware    {hw.world_size} x {inert_text(hw.device, 40)} ({hw.nodes} node(s) x {hw.per_node})",
        f"Batch       {plan.train.global_batch} sequences = {plan.tokens_per_step:,} tokens per step "
        f"({layout.micro_batch} per micro-batch, {accumulation} micro-batch(es) per rank), {plan.train.precision}",
        f"Layout      {layout.describe()}",
        f"Strategies  {', '.join(inert_text(s.name, 40) for s in strategies) or 'none'}",
    ]
    if prediction is not None:
        band = f" {prediction.step_band}" if prediction.step_band else ""
        lines.append(
            f"Predicted   {format_bytes(prediction.memory_bytes)} of {format_bytes(prediction.capacity_bytes)} "
            f"per device; step {prediction.step_s:.3g} s{band}; {prediction.tokens_per_s:,.0f} tokens/s"
        )
        if prediction.memory_warning:
            lines += textwrap.wrap(
                _docstring_words(prediction.memory_warning.removeprefix("warning: ")),
                width=100,
                initial_indent="Warning     ",
                subsequent_indent=" " * 12,
            )
    return "\n".join(lines) + "\n"


def _docstring_words(text: str) -> str:
    """planc's own words for the docstring: one line, nothing that could end it or escape (no quote
    or backslash). Unlike :func:`inert_text`, non-ASCII stays: these words hold no user text."""
    return " ".join(text.split()).replace("\\", "/").replace('"', "'")
