"""Host overhead per eager op: what a small model pays for every kernel, whatever its size.

Eager PyTorch spends microseconds per op on the host (dispatch, autograd recording, kernel
launch); on a GPU that hides behind the kernels while the queue stays ahead of the host, on a CPU
it adds to every op, and tiny models (the CPU equivalence matrix: hidden 32) are made of it. The
cost model multiplies the cost per op by the ops planc's program runs per block, micro-batch and
step (:mod:`planc.cost.dispatch`, counted with a ``TorchDispatchMode`` by
``tools/count_eager_ops.py``), so it is measured here on that program's own ops: planc's models
(a GPT and a Llama of :data:`LAYERS` blocks, hidden 32, 16 tokens a row; embedding, head and
loss included), forward and backward, at :data:`ROWS` rows, less the kernels the cost model
prices for the same model (GEMMs, attention, memory traffic at the rates just measured), over the
aten ops that ran, counted the same way.

Why planc's models and why two sizes: ops differ in host cost, and on a CPU small ops cost more
the larger their tensors, beyond what the memory bandwidth says. Until 2026-11-29 this timed a
chain of 100 elementwise multiplies: 3.9-4.9 us per op on this project's 2-core host, where
planc's models at 8 rows read 8.3-8.5 us per op and at 2 rows 5.6-6.1 in the same minutes, of
which the cost model's kernels explain 0.6-2.0 us. The CPU matrix then ran 26 of its 28 cases
slower than predicted (median 27 %; docs/accuracy.md).

On a GPU the kernels run behind the host at these sizes: nothing is taken off there, and the two
sizes read about the same.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from planc.calibrate.timing import interleaved_medians
from planc.calibrate.tp_block import SPEC
from planc.spec.hardware_profile import MODE_BYTES, MeasuredRates, OpCost, OpMode
from planc.spec.model import ModelSpec

#: Blocks of each measured model: the CPU matrix's depth (the edges -- embedding, head, loss --
#: cost more per op than a block's ops: 10.2-10.6 against 8.8-9.2 us at 1 and 4 blocks of a GPT).
LAYERS = 4
#: The two block families planc builds, as ModelSpec fields over ``tp_block.SPEC`` (a GPT block).
FAMILIES: tuple[dict[str, object], ...] = ({}, {"norm": "rmsnorm", "mlp": "swiglu", "position": "rope", "bias": False})
#: The precisions planc's model runs its ops in (:data:`planc.spec.hardware_profile.OpMode`).
MODES: tuple[OpMode, ...] = ("fp32", "bf16", "autocast")
#: Rows of 16 tokens of the two measured micro-batches: 512 and 4096 activation elements per op at
#: hidden 32, the range of the CPU matrix's micro-batches.
ROWS = (1, 8)


class _CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def measure_dispatch(device: torch.device, budget: float, rates: MeasuredRates) -> tuple[OpCost, ...]:
    """Seconds per op of planc's models beyond the kernels the cost model prices with ``rates``, at
    each of :data:`ROWS`: fp32 (both families' time over both families' ops), and under bf16
    parameters and autocast over fp32 parameters, each per fp32 op (the cost model counts ops in
    fp32; a bf16 mode's casts and slower small kernels are in its figure). Every (size, family,
    mode) is timed in the same rounds (:func:`~planc.calibrate.timing.interleaved_medians`)."""
    configs = [(rows, family, mode) for rows in ROWS for family in FAMILIES for mode in MODES]
    specs = [ModelSpec.model_validate({**SPEC, **family, "layers": LAYERS}) for _, family, _ in configs]
    steps = [_model_step(spec, rows, device, mode) for spec, (rows, _, mode) in zip(specs, configs)]
    seconds = interleaved_medians(steps, device, budget)
    points = []
    for rows in ROWS:
        beyond = dict.fromkeys(MODES, 0.0)
        ops = 0
        for spec, (r, _, mode), step, took in zip(specs, configs, steps, seconds):
            if r != rows:
                continue
            if mode == "fp32":
                with _CountOps() as counted:
                    step()
                ops += counted.count
            kernels = _kernel_seconds(spec, rows, rates, mode) if device.type == "cpu" else 0.0
            beyond[mode] += took - kernels
        per_op = {mode: max(0.0, total) / ops for mode, total in beyond.items()}
        points.append(
            OpCost(
                elements=rows * SPEC["seq_len"] * SPEC["hidden"],
                seconds=per_op["fp32"],
                seconds_bf16=per_op["bf16"],
                seconds_autocast=per_op["autocast"],
            )
        )
    return tuple(points)


def _model_step(spec: ModelSpec, rows: int, device: torch.device, mode: OpMode):
    """Forward, loss and backward of planc's model of ``spec`` on ``rows`` rows, in ``mode``."""
    from planc.runtime.transformer import build_model, init_weights, loss_fn

    torch.manual_seed(0)
    model = build_model(spec, device=device)
    init_weights(model, seed=0, spec=spec)
    if mode == "bf16":
        model = model.to(torch.bfloat16)
    tokens = torch.randint(0, spec.vocab, (rows, spec.seq_len + 1), device=device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=mode == "autocast"):
            loss_fn(model(inputs), targets, spec.vocab).backward()
        for p in model.parameters():
            p.grad = None

    return step


def _kernel_seconds(spec: ModelSpec, rows: int, rates: MeasuredRates, mode: OpMode) -> float:
    """What the cost model prices for the kernels of :func:`_model_step` on a CPU with ``rates``
    (no host time): every block forward and backward, the embedding, head and loss."""
    from planc.cost.compute import block_times, device_for, embedding_times, head_times
    from planc.cost.profile import PROFILES, on_hardware
    from planc.spec.hardware import HardwareSpec

    compute_bytes, residual_bytes = MODE_BYTES[mode]
    kernels_only = rates.model_copy(update={"seconds_per_op": 0.0, "op_costs": ()})
    hardware = HardwareSpec.model_validate({"device": "cpu", "measured": kernels_only})
    device = device_for(hardware, "fp32" if mode == "fp32" else "bf16")
    profile = on_hardware(PROFILES["planc"], is_cpu=True)
    block = block_times(spec, rows, 1, False, device, compute_bytes, residual_bytes, profile)
    embedding = embedding_times(spec, rows, 1, device, residual_bytes)
    head = head_times(spec, rows, 1, False, device, compute_bytes, residual_bytes)
    return spec.layers * (block.forward + block.backward) + sum(embedding) + sum(head)
