"""ZeRO-1's optimizer states per data-parallel rank: torch's greedy partition of whole tensors.

The reference is torch itself: ``ZeroRedundancyOptimizer._partition_parameters`` over the
runtime's model (built on fake tensors in a ``fake`` world of ``dp`` ranks) and planc's parameter
groups; the cost model must give every rank the same number of elements.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from planc.cost.driver import evaluate
from planc.cost.params import stage_params, stage_tensor_sizes
from planc.cost.zero_partition import greedy_partition, zero1_elements_per_rank, zero1_shares_per_rank
from planc.spec import Layout, build_plan
from planc.stages import stages_of_rank
from planc.strategies.registry import load_registry

MODELS = {
    "gpt (biases, LayerNorm, learned positions)": dict(layers=3, hidden=64, heads=4, vocab=1000, seq_len=32),
    "llama (SwiGLU, RMSNorm, GQA, RoPE)": dict(
        layers=3,
        hidden=64,
        heads=4,
        kv_heads=2,
        vocab=1000,
        seq_len=32,
        mlp="swiglu",
        norm="rmsnorm",
        position="rope",
        bias=False,
    ),
    "tied embeddings": dict(layers=2, hidden=64, heads=4, vocab=512, seq_len=32, tie_embeddings=True),
    "qkv biases only": dict(
        layers=2, hidden=64, heads=4, vocab=512, seq_len=32, bias=False, qkv_bias=True, norm="rmsnorm"
    ),
}


def _spec(model: dict):
    return build_plan({"model": model, "hardware": {"device": "cpu"}, "train": {"global_batch": 8}}).model


def _torch_partition(spec, dp: int) -> list[int]:
    return [elements for elements, _ in _torch_shares(spec, dp)]


def _torch_shares(spec, dp: int) -> list[tuple[int, int]]:
    from planc.runtime.optim import parameter_groups
    from planc.runtime.transformer import build_model
    from planc.verify.fake_world import fake_process_group, fake_tensors

    if dist.is_initialized():
        dist.destroy_process_group()
    with fake_process_group(0, dp), fake_tensors():
        model = build_model(spec, device="cpu")
        optimizer = ZeroRedundancyOptimizer(
            parameter_groups(model.parameters(), 0.1), optimizer_class=torch.optim.AdamW, lr=1e-3
        )
        return [
            (sum(p.numel() for group in groups for p in group["params"]), sum(len(group["params"]) for group in groups))
            for groups in optimizer._partition_parameters()
        ]


@pytest.mark.parametrize("dp", [2, 8, 64])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_rank_holds_what_torchs_partition_gives_it(name, dp):
    spec = _spec(MODELS[name])
    assert list(zero1_elements_per_rank(spec, 1, 1, 1, 0, dp)) == _torch_partition(spec, dp)


@pytest.mark.parametrize("dp", [2, 8])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_rank_steps_the_tensors_torchs_partition_gives_it(name, dp):
    # The step's per-tensor cost (clipping, the optimizer's loop on a CPU) follows the tensors.
    spec = _spec(MODELS[name])
    assert list(zero1_shares_per_rank(spec, 1, 1, 1, 0, dp)) == _torch_shares(spec, dp)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize(
    ("tp", "pp", "v", "style"), [(1, 1, 1, "looped"), (2, 2, 1, "looped"), (4, 2, 2, "looped"), (1, 2, 2, "v")]
)
def test_the_tensors_add_up_to_the_stage_parameters(name, tp, pp, v, style):
    spec = _spec(MODELS[name] | {"layers": 8})
    if style == "v" and spec.tie_embeddings:
        pytest.skip("the V placement refuses tied embeddings")
    for rank in range(pp):
        tensors = [
            sum(sum(group) for group in stage_tensor_sizes(spec, tp, pp, v, stage))
            for stage in stages_of_rank(rank, pp, v, style)
        ]
        assert sum(tensors) == stage_params(spec, tp, pp, v, rank, style).params


def test_ties_go_to_the_lowest_rank_and_loads_carry_across_groups():
    # by hand: 5 -> r0; 3 -> r1 (0 < 5); 3 -> r2; then the second group: 2 -> r1 (3, lowest of r1 = r2),
    # 1 -> r2 (3 < 5)
    assert greedy_partition(((3, 5, 3), (1, 2)), 3) == (5, 5, 4)


#: Llama 3 8B's embedding, 128,256 x 4,096 parameters.
LLAMA3_8B_EMBEDDING = 128_256 * 4096


def _llama3_8b_zero1_over_64():
    """(plan, estimate) of Llama 3 8B under ZeRO-1 over 64 data-parallel H100s."""
    plan = build_plan(
        {
            "model": {"preset": "llama3-8b", "seq_len": 2048},
            "hardware": {"device": "H100-SXM", "nodes": 8, "per_node": 8},
            "train": {"global_batch": 64, "precision": "bf16"},
        }
    )
    layout = Layout(tp=1, pp=1, dp=64, zero=1, recompute="full", schedule=None, micro_batch=1)
    return plan, evaluate(plan, layout, load_registry().passes(plan, layout))


def test_the_rank_with_the_embedding_sets_the_stage_memory_under_zero1():
    # Llama 3 8B over 64 data-parallel ranks: an even share is 8.03 B / 64 = 125 M parameters, but
    # the embedding (525,336,576) goes whole to rank 0 and the head to rank 1; the other tensors
    # (at most 58.7 M each) fill ranks 2..63 to ~113 M, never past them, so rank 0 holds the
    # embedding's states and nothing else: 8 bytes (AdamW's m and v) each.
    plan, estimate = _llama3_8b_zero1_over_64()
    stage = estimate.stages[0]
    assert stage.optimizer == 8 * LLAMA3_8B_EMBEDDING and stage.master == 0
    assert stage.optimizer > 4 * 8 * plan.model.params / 64  # what Psi / N_d said


def test_the_zero1_step_lasts_as_long_as_the_rank_with_the_embedding():
    # The same: ZeroRedundancyOptimizer broadcasts each rank's parameters after its local step, so
    # the step waits for rank 0, which steps the embedding, not an even 125 M share. Fused AdamW
    # with clipping moves 40 bytes per parameter; on an H100 that traffic (21 GB, ~7 ms) is far
    # above the host's 40 ops per step, which it hides.
    from planc.cost.compute import device_for
    from planc.cost.optimizer_step import OPTIMIZER_STEP_BYTES

    plan, estimate = _llama3_8b_zero1_over_64()
    traffic = OPTIMIZER_STEP_BYTES["fused"]["adamw"] * LLAMA3_8B_EMBEDDING
    assert estimate.optimizer == pytest.approx(traffic / device_for(plan.hardware, "bf16").memory_rate)
