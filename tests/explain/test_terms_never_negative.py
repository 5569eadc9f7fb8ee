"""Every amount ``planc explain`` prints is one a reader can take as "this much memory is held by
X" (or "this much time goes to X"): none is negative, and the printed parts add up to the printed
totals -- on every representative pipeline rank of a broad sweep of layouts, not only the worst
rank that explain shows, so that a term going negative on any rank fails here first.

Pure cost-model calls (no launch): DDP, ZeRO-1/2/3, TP with and without sequence parallelism,
PP under GPipe, 1F1B, interleaved, looped zero-bubble and ZBV with one to four rounds of
micro-batches, each recomputation, fp32 and bf16, on a tiny model (8 CPU processes) and on
Llama 3 8B at 8 and 64 A100s."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from planc.cost import evaluate
from planc.cost.estimate import Estimate, StageMemory
from planc.dsl.load import load_plan_text
from planc.explain.memory_table import ACCUMULATED_GRADIENTS, activation_rows, memory_dict, memory_rows, transient_rows
from planc.spec import Layout
from planc.spec.plan import Plan
from planc.strategies.registry import load_registry
from planc.verify.predicted import estimate_for

REGISTRY = load_registry()

TINY = """model "tiny" { layers = 8  hidden = 512  heads = 8  vocab = 4096  seq_len = 256
  mlp = gelu  norm = layernorm  position = learned }"""
LLAMA = 'model { preset = "llama3-8b" }'
#: (model, device, [(nodes, per_node)])
MACHINES = ((TINY, "cpu", [(2, 4)]), (LLAMA, "A100-80GB", [(1, 8), (8, 8)]))
#: (schedule, virtual stages, ZBV)
SCHEDULES = (
    ("gpipe", 1, False),
    ("1f1b", 1, False),
    ("interleaved", 2, False),
    ("zero-bubble", 1, False),
    ("zero-bubble", 2, False),
    ("zero-bubble", 2, True),
)
RECOMPUTE = ("none", "selective", "full")


def _plan(model: str, device: str, nodes: int, per_node: int, batch: int, precision: str, zbv: bool) -> Plan:
    use = '\nuse pipeline { zero_bubble = "zbv" }' if zbv else ""
    text = (
        f'{model}\nhardware {{ device = "{device}"  nodes = {nodes}  per_node = {per_node} }}\n'
        f"train {{ global_batch = {batch}  micro_batch = 1  precision = {precision}  optimizer = adamw }}{use}\n"
    )
    return load_plan_text(text, "sweep.plan", strategies=REGISTRY)


def _layouts() -> Iterator[tuple[str, Plan, Layout]]:
    """Every legal layout of the sweep. Recomputation and sequence parallelism take turns rather
    than multiply the count (zero-bubble allows no recomputation: it keeps all its layouts)."""
    turn = itertools.count()
    for model, device, machines in MACHINES:
        for (nodes, per_node), tp, pp in itertools.product(machines, (1, 2, 8), (1, 2, 4)):
            world = nodes * per_node
            if world % (tp * pp) or tp > per_node:
                continue
            dp = world // (tp * pp)
            schedules = SCHEDULES if pp > 1 else ((None, 1, False),)
            for (schedule, v, zbv), rounds, precision in itertools.product(schedules, (1, 2, 4), ("bf16", "fp32")):
                m = pp * rounds if pp > 1 else rounds  # m from p to 4 p
                plan = _plan(model, device, nodes, per_node, dp * m, precision, zbv)
                for zero in range(4) if dp > 1 else (0,):
                    k = next(turn)
                    recompute = "none" if schedule == "zero-bubble" else RECOMPUTE[k % 3]
                    sp = tp > 1 and k // 3 % 2 == 1
                    layout = Layout(
                        tp=tp,
                        pp=pp,
                        dp=dp,
                        zero=zero,
                        recompute=recompute,
                        schedule=schedule,
                        virtual_stages=v,
                        micro_batch=1,
                        sequence_parallel=sp,
                    )
                    if not REGISTRY.check(plan, layout):
                        yield f"{model[:12]} {precision} {layout.describe()} m={m}", plan, layout


def _rank(est: Estimate, s: StageMemory) -> Estimate:
    """``est`` with ``s`` as its only (so its worst) rank: what explain would print for it."""
    return est.replace(stages=(s,))


def _problems(where: str, est: Estimate) -> Iterator[str]:
    for s in est.stages:
        at = f"{where} rank {s.rank}"
        one = _rank(est, s)
        groups = memory_rows(one)
        for group, value, rows in groups:
            yield from (f"{at}: {group} / {name} = {v:.0f} B" for name, v in rows if v < 0)
            if abs(sum(v for _, v in rows) - value) > 1:
                yield f"{at}: the rows of {group} do not add up to it"
        # every term, the ones "not at the peak" too
        for row in (*activation_rows(s), *transient_rows(s)):
            if row.value < 0:
                yield f"{at}: {row.name} = {row.value:.0f} B"
        if s.grads_after_backward < 0:
            yield f"{at}: gradients after the first backward = {s.grads_after_backward:.0f} B"
        if abs(sum(value for _, value, _ in groups) - s.total) > 1:
            yield f"{at}: the groups do not add up to the total"
        m = memory_dict(one)
        parts = (
            "params_bytes",
            "master_bytes",
            "grads_bytes",
            "optimizer_bytes",
            "activations_bytes",
            "transient_bytes",
        )
        if abs(sum(m[k] for k in parts) - m["total_bytes"]) > 1:
            yield f"{at}: --json's parts do not add up to total_bytes"
        for key, terms in (("activations_bytes", m["activation_terms"]), ("transient_bytes", m["transient_terms"])):
            if abs(sum(t["bytes"] for t in terms if t["at_peak"]) - m[key]) > 1:
                yield f"{at}: --json's at-peak rows do not add up to {key}"
    for name, seconds in est.step_parts().items():
        if seconds < 0:
            yield f"{where}: step time term {name} = {seconds} s"
    if abs(sum(est.step_parts().values()) - est.step_s) > 1e-9 * est.step_s:
        yield f"{where}: the step time's parts do not add up to it"


def test_no_printed_term_is_negative_and_the_parts_add_up():
    cases = list(_layouts())
    assert len(cases) > 1000  # the sweep is broad (every pipeline schedule, ZeRO stage, m = p .. 4p)
    problems = [
        p
        for where, plan, layout in cases
        for p in _problems(where, evaluate(plan, layout, REGISTRY.passes(plan, layout)))
    ]
    assert not problems, "\n".join(problems[:20])


# The tiny looped zero-bubble plan of tests/verify/test_simulate_pipeline.py with one round of
# micro-batches (m = p = 4): PP 4 x DP 2, v = 2, 8 blocks of hidden 512, bf16 over ZeRO-2.
ZERO_BUBBLE = """model "tiny" { layers = 8  hidden = 512  heads = 4  vocab = 512  seq_len = 64
  mlp = gelu  norm = layernorm  position = learned }
hardware { device = "cpu"  nodes = 2  per_node = 4 }
train { global_batch = 8  micro_batch = 1  precision = bf16  optimizer = adamw }
layout { tp = 1  pp = 4  dp = 2  zero = 2  schedule = zero-bubble  virtual_stages = 2  recompute = none }
"""
# A block (hidden 512, ffn 2048): two layernorms 2 x 1,024; wq, wk, wv, wo with bias
# 4 x 262,656; w1 1,050,624; w2 1,049,088 = 3,152,384 parameters.
BLOCK = 3_152_384


@pytest.mark.parametrize(
    "rank, gradients",
    [
        # Rank 0 (stages 0 and 4) peaks in 4W1: stage 4's fp32 accumulation alone, 4 x BLOCK
        # (simulated, tests/verify); stage 0 has none yet. The sharded gradients, 4 x (2 blocks +
        # embedding 512 x 512 + positions 64 x 512) / 2 = 13,199,360 B, exist only after the step.
        (0, 4 * BLOCK),
        # The last rank (stages 3 and 7) peaks in 7W1 with no accumulation at all, its head's
        # included: stage 7's input passes all ran before its weight passes.
        (3, 0),
    ],
)
def test_a_zero_bubble_rank_with_one_round_holds_only_its_accumulation(rank, gradients):
    # Before: the model states counted the 12.5 MiB of sharded gradients and a buffer took them
    # off again, "unsharded fp32 gradients kept across micro-batches (less the sharded ones)":
    # -12.5 MiB on the last rank, -0.56 MiB on rank 0.
    plan = load_plan_text(ZERO_BUBBLE, "zb.plan", strategies=REGISTRY)
    layout = Layout(tp=1, pp=4, dp=2, zero=2, recompute="none", schedule="zero-bubble", virtual_stages=2, micro_batch=1)
    est = estimate_for(plan, layout, REGISTRY)[1]
    s = next(s for s in est.stages if s.rank == rank)
    assert s.grads_at_peak == gradients
    (states,) = [rows for group, _, rows in memory_rows(_rank(est, s)) if group == "model states"]
    assert (ACCUMULATED_GRADIENTS, gradients) in states
    assert all(t.value >= 0 for t in s.transient)
    assert not any("less the sharded" in t.name for t in s.transient)
