"""Activation memory of planc's runtime, measured, against the cost model's prediction.

    python bench/activation_memory.py            # one process, then one launch of 2 ranks (TP 2)

For each model family (``gpt``: GELU, LayerNorm, learned positions, biases; ``llama``: SwiGLU,
RMSNorm, RoPE, GQA), precision and layout, the model is built by :func:`planc.runtime.compose.compose`
-- the real ``tensor_parallel`` and ``recompute`` strategies -- and one forward runs under
:class:`LiveStorages`, a ``TorchDispatchMode`` that notes (weakly) the storage of every tensor an
op returns. What is still alive after the forward, minus the parameters (and autocast's bf16
weight copies, which the cost model counts as the ``bf16`` strategy's term), is what the forward
left behind for backward: tensors autograd saved, the inputs ``torch.utils.checkpoint`` keeps and
the outputs selective checkpointing caches (those bypass ``saved_tensors_hooks``, so counting
hooks alone would miss them). Storages are counted once however many tensors share them. The
bytes of one block are ``(bytes with 3 layers - bytes with 1 layer) / 2``: embedding, head and the
logits cancel.

The prediction is :func:`planc.cost.memory.layer_activation_bytes` for the same spec, micro-batch,
TP degree, sequence parallelism and element sizes (:func:`planc.cost.context.dtypes`). The
table prints both per block and micro-batch, and their ratio.

The worker also counts the aten ops that run during ``backward()`` (matmuls, attention,
collectives): recomputation shows there as forward ops run again. The tests read the same numbers
(tests/runtime/test_activation_memory.py).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import weakref
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from planc.cost.context import dtypes
from planc.cost.memory import layer_activation_bytes
from planc.cost.profile import PLANC_RUNTIME_CPU
from planc.spec import Layout, build_plan

ROOT = Path(__file__).resolve().parent.parent

FAMILIES = {
    "gpt": dict(mlp="gelu", norm="layernorm", position="learned", kv_heads=4),
    "llama": dict(mlp="swiglu", norm="rmsnorm", position="rope", kv_heads=2),
}
#: Small enough for a laptop, wide enough that per-row statistics (norm rstd, the log-sum-exp)
#: are a few percent of a block: T = b s = 64 tokens, h = 64, f = 4h (GELU) or 8h/3 -> 192 (SwiGLU).
MODEL = dict(hidden=64, heads=4, vocab=128, vocab_multiple=32, seq_len=32)
MICRO_BATCH = 2
MODES = ("none", "selective", "full")

#: What the backward op counts are grouped into.
MATMULS = {"mm", "addmm", "bmm", "baddbmm"}
COLLECTIVES = {"all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single"}


def op_kind(name: str) -> str | None:
    if name in MATMULS:
        return "matmul"
    if "scaled_dot_product" in name and "backward" not in name:
        return "attention"
    if name in COLLECTIVES:
        return "collective"
    return None


class LiveStorages(TorchDispatchMode):
    """Notes the storage of every tensor an op returns, without keeping it alive.

    A DTensor's bytes are its local shard's. Storage addresses are reused once freed, so a note
    whose storage died is replaced by the new one at the same address.
    """

    def __init__(self):
        super().__init__()
        self.notes: dict[int, weakref.ref] = {}
        self.weight_copies: set[int] = set()
        self.parameters: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        copies_a_weight = (
            func is torch.ops.aten._to_copy.default
            and isinstance(args[0], torch.Tensor)
            and storage_key(args[0]) in self.parameters
        )
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = local(tensor).untyped_storage()
                key = storage._cdata
                note = self.notes.get(key)
                if note is None or note() is None:
                    self.notes[key] = weakref.ref(storage)
                    self.weight_copies.discard(key)
                if copies_a_weight:
                    self.weight_copies.add(key)
        return out

    def alive_bytes(self) -> int:
        """Bytes of the noted storages still alive, parameters and their autocast copies excluded.

        Read until two readings 20 ms apart agree: garbage in reference cycles (DTensor
        redistribution makes some) is collected first, and gloo's worker threads can hold a finished
        collective's output for a moment after ``wait_tensor`` returned.
        """
        previous = None
        for _ in range(50):
            gc.collect()
            now = sum(storage.nbytes() for key, storage in self._alive() if key not in self.weight_copies)
            if now == previous:
                break
            previous = now
            time.sleep(0.02)
        return now

    def _alive(self):
        for key, note in self.notes.items():
            storage = note()
            if storage is not None and key not in self.parameters:
                yield key, storage


class CountOps(TorchDispatchMode):
    """Counts matmul / attention / collective ops by kind."""

    def __init__(self):
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = op_kind(func.overloadpacket.__name__)
        if kind is not None:
            self.counts[kind] += 1
        return func(*args, **(kwargs or {}))


def local(tensor: torch.Tensor) -> torch.Tensor:
    return getattr(tensor, "_local_tensor", tensor)


def storage_key(tensor: torch.Tensor) -> int:
    return local(tensor).untyped_storage()._cdata


def make_plan(family: str, layers: int, precision: str, world: int):
    return build_plan(
        {
            "model": dict(MODEL, layers=layers, **FAMILIES[family]),
            "hardware": {"device": "cpu", "per_node": world},
            "train": {"global_batch": MICRO_BATCH, "precision": precision, "seed": 1},
        }
    )


def make_layout(tp: int, sp: bool, recompute: str) -> Layout:
    return Layout(
        tp=tp, pp=1, dp=1, zero=0, recompute=recompute, schedule=None, micro_batch=MICRO_BATCH, sequence_parallel=sp
    )


def forward_left_behind(
    family: str, layers: int, precision: str, tp: int, sp: bool, recompute: str, bf16_params: bool = False
) -> tuple[int, Counter]:
    """(bytes the forward leaves for backward, ops by kind that the backward runs)."""
    from planc.runtime.compose import compose
    from planc.runtime.transformer import loss_fn
    from planc.strategies.registry import load_registry

    plan = make_plan(family, layers, precision, tp)
    job = compose(plan, make_layout(tp, sp, recompute), load_registry())
    (model,) = job.model_parts
    if bf16_params:  # bf16 parameters, as FSDP's MixedPrecisionPolicy gathers them: no autocast
        model.to(torch.bfloat16)
    rows = torch.randint(
        0, plan.model.vocab, (MICRO_BATCH, plan.model.seq_len + 1), generator=torch.Generator().manual_seed(0)
    )
    inputs, targets = rows[:, :-1], rows[:, 1:]
    live = LiveStorages()
    live.parameters = {storage_key(p) for p in model.parameters()}
    with live:
        logits = model(inputs)
    left = live.alive_bytes()
    with job.loss_context():
        loss = loss_fn(logits, targets)
        del logits
        with CountOps() as counter:
            loss.backward()
    return left, counter.counts


def block_bytes(family: str, precision: str, tp: int, sp: bool, recompute: str, bf16_params: bool = False):
    """Measured bytes one block keeps per micro-batch, and its backward op counts (1 layer)."""
    one, counts = forward_left_behind(family, 1, precision, tp, sp, recompute, bf16_params)
    three, _ = forward_left_behind(family, 3, precision, tp, sp, recompute, bf16_params)
    return (three - one) / 2, counts


def predicted_bytes(
    family: str, precision: str, tp: int, sp: bool, recompute: str, bf16_params: bool = False, profile=PLANC_RUNTIME_CPU
) -> float:
    plan = make_plan(family, 1, precision, tp)
    # bf16 parameters: FSDP2's policy (zero 3 over 2 ranks); otherwise the measured program has no data
    # parallelism, so bf16 runs under autocast over fp32 parameters (dp 1: no replicate either).
    e, r = dtypes(plan, 3 if bf16_params else 0, 2 if bf16_params else 1, profile)
    act = layer_activation_bytes(plan.model, MICRO_BATCH, tp, sp, e, r, profile)
    return getattr(act, recompute)


#: (label, precision, bf16 parameters) of the single-process runs.
PRECISIONS = [("fp32", "fp32", False), ("bf16 autocast", "bf16", False), ("bf16 params", "bf16", True)]
#: (tp, sequence parallel) of the two-process runs, in fp32 and under autocast.
TP_LAYOUTS = [(2, False), (2, True)]


def run_cases(cases) -> list[dict]:
    results = []
    for family, label, precision, bf16_params, tp, sp in cases:
        for mode in MODES:
            measured, counts = block_bytes(family, precision, tp, sp, mode, bf16_params)
            results.append(
                dict(
                    family=family,
                    precision=label,
                    tp=tp,
                    sp=sp,
                    mode=mode,
                    measured=measured,
                    predicted=predicted_bytes(family, precision, tp, sp, mode, bf16_params),
                    backward_ops=dict(counts),
                )
            )
    return results


def single_process_cases(families=tuple(FAMILIES), precisions=PRECISIONS):
    return [(f, label, prec, bf16, 1, False) for f in families for label, prec, bf16 in precisions]


def tp_cases(families=tuple(FAMILIES), precisions=PRECISIONS[:2]):
    return [
        (f, label, prec, bf16, tp, sp) for f in families for label, prec, bf16 in precisions for tp, sp in TP_LAYOUTS
    ]


def launch_tp(timeout: float = 300, pairs: list[tuple[str, str]] | None = None) -> list[dict]:
    """The TP cases on 2 ranks, in one launch of the tests' harness (tests/ranks.py); rank 0's results.
    ``pairs``: only these (family, precision label) pairs; every family in the first two precisions
    when not given."""
    sys.path.insert(0, str(ROOT / "tests"))
    from ranks import run_ranks

    return run_ranks("bench/activation_memory.py:tp_worker", 2, pairs, timeout=timeout)


def tp_worker(pairs: list[list[str]] | None) -> list[dict]:
    """What each of the 2 ranks runs."""
    cases = tp_cases()
    if pairs is not None:
        cases = [c for c in cases if [c[0], c[1]] in pairs]
    return run_cases(cases)


def print_table(results: list[dict]) -> None:
    unit = "KiB per block per micro-batch"
    print(
        f"{'family':<7}{'precision':<15}{'layout':<9}{'recompute':<11}{'measured':>10}{'predicted':>11}"
        f"{'ratio':>7}   backward matmul/attention/collective   ({unit})"
    )
    for r in results:
        layout = "1 proc" if r["tp"] == 1 else f"TP {r['tp']}" + (" SP" if r["sp"] else "")
        ops = r["backward_ops"]
        print(
            f"{r['family']:<7}{r['precision']:<15}{layout:<9}{r['mode']:<11}{r['measured'] / 1024:>10.1f}"
            f"{r['predicted'] / 1024:>11.1f}{r['measured'] / r['predicted']:>7.3f}   "
            f"{ops.get('matmul', 0):>3} / {ops.get('attention', 0)} / {ops.get('collective', 0)}"
        )


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    results = run_cases(single_process_cases()) + launch_tp()
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
