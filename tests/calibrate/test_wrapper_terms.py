"""The measured wrapper overheads of a hardware profile enter the strategies' cost passes, and only then."""

from __future__ import annotations

import pytest

from planc.cost.driver import SUMMARY_NAME, evaluate
from planc.cost.wrappers import DTENSOR_OPTIMIZER
from planc.spec import Layout
from planc.spec.hardware_profile import HardwareProfile
from planc.strategies.registry import load_registry
from tests.calibrate.test_profile import plan_with, profile_dict

DDP_PER_TENSOR = 20e-6
REPLICATE_PER_UNIT = 300e-6
FSDP_PER_UNIT = 1e-3
TP_PER_BLOCK = 2e-3
TP_SP_PER_BLOCK = 5e-3
PP_PER_ACTION = 300e-6
SPLIT_BACKWARD_PER_BLOCK = 800e-6
CHECKPOINT_PER_BLOCK = 700e-6
SELECTIVE_PER_BLOCK = 2e-3
DTENSOR_OPTIMIZER_PER_TENSOR = 100e-6


def wrapper_profile(**wrappers) -> dict:
    profile = profile_dict()
    profile["measured"] = {**profile["measured"], "wrappers": wrappers}
    return profile


def other_terms(plan, **layout) -> dict:
    """The layout's named time terms but the step summary, which every multi-rank step pays
    (tests/cost/test_flops_comm_compute.py)."""
    values = {"tp": 1, "pp": 1, "dp": 1, "zero": 0, "recompute": "none", "schedule": None, "micro_batch": 2}
    lay = Layout(**{**values, **layout})
    registry = load_registry()
    terms = evaluate(plan, lay, registry.passes(plan, lay)).other
    return {t.name: t.value for t in terms if t.name != SUMMARY_NAME}


@pytest.fixture
def calibrated(tmp_path):
    return plan_with(
        tmp_path,
        wrapper_profile(
            ddp_per_tensor=DDP_PER_TENSOR,
            replicate_per_unit=REPLICATE_PER_UNIT,
            fsdp_per_unit=FSDP_PER_UNIT,
            tp_per_block=TP_PER_BLOCK,
            tp_sp_per_block=TP_SP_PER_BLOCK,
            pp_per_action=PP_PER_ACTION,
            split_backward_per_block=SPLIT_BACKWARD_PER_BLOCK,
            checkpoint_per_block=CHECKPOINT_PER_BLOCK,
            selective_per_block=SELECTIVE_PER_BLOCK,
            dtensor_optimizer_per_tensor=DTENSOR_OPTIMIZER_PER_TENSOR,
        ),
    )


def fp32(plan):
    return plan.model_copy(update={"train": plan.train.model_copy(update={"precision": "fp32"})})


def test_ddp_charges_every_parameter_tensor_once_per_step(calibrated):
    # fp32 DistributedDataParallel; gpt, 2 layers, global batch 8 on dp 2 at micro-batch 2: 2
    # micro-batches, the first under no_sync (no reducer work), so once per step.
    # Tensors: per block 6 linears + 6 biases + 2 LayerNorms x 2 = 16; embeddings 2 (token,
    # learned position); final LayerNorm 2; untied head 1: 2 x 16 + 5 = 37.
    name = "DDP hooks and buckets (measured)"
    assert other_terms(fp32(calibrated), dp=2)[name] == pytest.approx(37 * DDP_PER_TENSOR)
    # ZeRO-1 runs DDP under its ZeroRedundancyOptimizer: the same term.
    assert other_terms(fp32(calibrated), dp=2, zero=1)[name] == pytest.approx(37 * DDP_PER_TENSOR)


def test_bf16_ddp_is_replicate_and_charges_fsdp_units(calibrated):
    # bf16 data parallelism runs FSDP2's replicate: 2 micro-batches x 4 units (2 blocks, embedding,
    # head); its parameters are DTensors, so the optimizer's step over them too (37 tensors, below).
    terms = other_terms(calibrated, dp=2)
    assert terms == {
        "replicate hooks and copies (measured)": pytest.approx(2 * 4 * REPLICATE_PER_UNIT),
        DTENSOR_OPTIMIZER: pytest.approx(37 * DTENSOR_OPTIMIZER_PER_TENSOR),
    }


def test_the_dtensor_optimizer_step_is_charged_once_per_tensor_where_parameters_are_dtensors(tmp_path, calibrated):
    # gpt, 2 layers: 37 parameter tensors (test_ddp_charges_every_parameter_tensor_once_per_step).
    # FSDP2 (ZeRO-2/3), replicate (bf16 DDP) and TP make every parameter a DTensor: AdamW's step
    # dispatches each op through DTensor.
    once = pytest.approx(37 * DTENSOR_OPTIMIZER_PER_TENSOR)
    for layout in ({"dp": 2, "zero": 3}, {"dp": 2, "zero": 2}, {"tp": 2}):
        assert other_terms(calibrated, **layout)[DTENSOR_OPTIMIZER] == once, layout
    # TP x FSDP on 4 devices: each rank holds 37 tensors (shards of them), still one optimizer step.
    four = plan_with(tmp_path, wrapper_profile(dtensor_optimizer_per_tensor=DTENSOR_OPTIMIZER_PER_TENSOR), per_node=4)
    assert other_terms(four, tp=2, dp=2, zero=3)[DTENSOR_OPTIMIZER] == once
    # fp32 DDP and ZeRO-1 keep plain tensors, and so does a pipeline alone.
    plain_layouts = (
        (fp32(calibrated), {"dp": 2}),
        (fp32(calibrated), {"dp": 2, "zero": 1}),
        (calibrated, {"pp": 2, "schedule": "1f1b"}),
    )
    for plan, layout in plain_layouts:
        assert DTENSOR_OPTIMIZER not in other_terms(plan, **layout), layout


def test_the_step_charges_clipping_per_tensor_and_the_optimizer_per_tensor_it_steps(tmp_path):
    # gpt, 2 layers: 37 parameter tensors per rank (test_ddp_charges_every_parameter_tensor_once_per_step).
    # Clipping runs over every tensor a rank holds; the optimizer over those it steps: all 37 under
    # DDP and FSDP (a shard of each); under torch's ZeRO-1 the tensors are dealt whole, and the step
    # lasts as long as the rank with the most parameters (torch's own partition says which, and how
    # many tensors it got). Neither is divided by the sharding, as the kernels' traffic is.
    from tests.cost.test_zero_partition import _torch_shares

    clip, optimizer = 3e-6, 5e-6
    (tmp_path / "bare").mkdir()
    measured = fp32(plan_with(tmp_path, wrapper_profile(clip_per_tensor=clip, optimizer_per_tensor=optimizer)))
    bare = fp32(plan_with(tmp_path / "bare", wrapper_profile()))

    def optimizer_seconds(plan, **layout) -> float:
        values = {"tp": 1, "pp": 1, "zero": 0, "recompute": "none", "schedule": None, "micro_batch": 2}
        lay = Layout(**{**values, **layout})
        return evaluate(plan, lay, load_registry().passes(plan, lay)).optimizer

    _, zero1_tensors = max(_torch_shares(measured.model, 2))
    assert 0 < zero1_tensors < 37
    for layout, stepped in (({"dp": 2}, 37), ({"dp": 2, "zero": 1}, zero1_tensors), ({"dp": 2, "zero": 3}, 37)):
        added = optimizer_seconds(measured, **layout) - optimizer_seconds(bare, **layout)
        assert added == pytest.approx(37 * clip + stepped * optimizer), layout


def test_fsdp_charges_every_unit_per_micro_batch(calibrated):
    # ZeRO-3 on dp 2, 2 micro-batches; units as the FSDP pass counts them: 2 blocks + embedding + head = 4.
    terms = other_terms(calibrated, dp=2, zero=3)
    assert terms["FSDP hooks and copies (measured)"] == pytest.approx(2 * 4 * FSDP_PER_UNIT)


def test_fsdp_charges_every_unit_per_collective_it_runs(tmp_path):
    # The stand-in's FSDP_PER_UNIT is one ZeRO-3 micro-batch of a unit: 3 collectives (gather in
    # forward, again in backward, reduce-scatter). ZeRO-2 on dp 2, 2 micro-batches, 4 units: one
    # gather and one reduce-scatter per micro-batch, 4 collectives per unit, 2/3 of ZeRO-3's.
    plan = plan_with(tmp_path, wrapper_profile(fsdp_per_unit=FSDP_PER_UNIT), per_node=4)
    name = "FSDP hooks and copies (measured)"
    assert other_terms(plan, dp=2, zero=2)[name] == pytest.approx(4 * 4 * FSDP_PER_UNIT / 3)
    # Under a pipeline (pp 2 x dp 2, 1F1B) the stage keeps its parameters gathered and reduces once
    # per step: 1 gather + 1 reduce-scatter per unit, whatever the 2 micro-batches; a stage holds
    # 1 block and the embedding (or the head): 2 units.
    piped = other_terms(plan, pp=2, dp=2, zero=2, schedule="1f1b")[name]
    assert piped == pytest.approx(2 * 2 * FSDP_PER_UNIT / 3)


def test_tp_charges_every_block_and_the_edges_per_micro_batch(calibrated):
    # tp 2, dp 1: global batch 8 at micro-batch 2 = 4 micro-batches x 2 layers; SP's own cost with
    # SP. The cost is per DTensor op: the measured GPT block's 26 + 80 in fp32 (DTENSOR_OPS, counted
    # by tools/count_eager_ops.py --dtensor); the embedding, head and loss run 35 more per micro-batch.
    name = "DTensor dispatch (measured)"
    plain = fp32(calibrated)
    assert other_terms(plain, tp=2)[name] == pytest.approx(4 * (2 + 35 / 106) * TP_PER_BLOCK)
    sp = other_terms(plain, tp=2, sequence_parallel=True)[name]
    assert sp == pytest.approx(4 * (2 + 35 / 106) * TP_SP_PER_BLOCK)
    # bf16 under tensor parallelism alone is autocast: its casts of the DTensor weights are DTensor
    # ops too, 42 + 96 per block and 41 outside the blocks
    assert other_terms(calibrated, tp=2)[name] == pytest.approx(4 * (2 * 138 + 41) / 106 * TP_PER_BLOCK)


def test_pipeline_charges_every_schedule_action(calibrated):
    # pp 2, dp 1, micro-batch 2: 4 micro-batches. 1F1B: forward + backward each = 8 actions;
    # zero-bubble (one chunk per rank) splits the backward in two: 12.
    name = "pipeline schedule actions (measured)"
    assert other_terms(calibrated, pp=2, schedule="1f1b")[name] == pytest.approx(8 * PP_PER_ACTION)
    zero_bubble = other_terms(calibrated, pp=2, schedule="zero-bubble")
    assert zero_bubble[name] == pytest.approx(12 * PP_PER_ACTION)


def test_zero_bubble_charges_its_split_backward_per_block_and_parameter_group(calibrated):
    # pp 2 at micro-batch 2: 4 micro-batches x 1 block per rank, at the measured GPT block's cost
    # (8 parameter groups: 6 linears with their biases, 2 LayerNorms); a Llama block has 9 (7
    # linears, 2 RMSNorms): 9 / 8 of it. No other schedule splits its backward.
    from planc.strategies.pipeline.cost_pass import SPLIT_BACKWARD

    assert other_terms(calibrated, pp=2, schedule="zero-bubble")[SPLIT_BACKWARD] == pytest.approx(
        4 * SPLIT_BACKWARD_PER_BLOCK
    )
    assert SPLIT_BACKWARD not in other_terms(calibrated, pp=2, schedule="1f1b")
    llama_model = calibrated.model.model_copy(update={"norm": "rmsnorm", "mlp": "swiglu", "bias": False})
    llama = calibrated.model_copy(update={"model": llama_model})
    assert other_terms(llama, pp=2, schedule="zero-bubble")[SPLIT_BACKWARD] == pytest.approx(
        4 * SPLIT_BACKWARD_PER_BLOCK * 9 / 8
    )


def test_recomputation_charges_every_block_per_micro_batch(calibrated):
    # dp 1 at micro-batch 2: 4 micro-batches x 2 layers, full or selective; nothing without recompute.
    name = "activation checkpointing's own work (measured)"
    assert other_terms(calibrated, recompute="full")[name] == pytest.approx(4 * 2 * CHECKPOINT_PER_BLOCK)
    assert other_terms(calibrated, recompute="selective")[name] == pytest.approx(4 * 2 * SELECTIVE_PER_BLOCK)
    assert name not in other_terms(calibrated)


def test_a_pipeline_bubble_idles_for_the_host_work_of_every_micro_batch(tmp_path):
    """Checkpointing's measured work is done inside each micro-batch's forward and backward, so a
    1F1B pipeline's bubble, idle slots of a stage's micro-batch, lasts longer by it too. pp 2 at
    micro-batch 2: 4 micro-batches, 1 layer per stage, bubble (p - 1) = 1 slot. Full recomputation's
    term is 4 x 1 x 700 us = 2.8 ms; the step grows by that plus one slot's share, 2.8 / 4 = 0.7 ms:
    3.5 ms. Without a pipeline it grows by the term alone."""

    def step_seconds(checkpoint_per_block: float, **layout) -> float:
        profile = wrapper_profile(checkpoint_per_block=checkpoint_per_block)
        plan = fp32(plan_with(tmp_path, profile))
        values = {"tp": 1, "pp": 1, "dp": 1, "zero": 0, "recompute": "full", "schedule": None, "micro_batch": 2}
        lay = Layout(**{**values, **layout})
        return evaluate(plan, lay, load_registry().passes(plan, lay)).step_s

    pipelined = step_seconds(CHECKPOINT_PER_BLOCK, pp=2, schedule="1f1b") - step_seconds(0.0, pp=2, schedule="1f1b")
    assert pipelined == pytest.approx(4 * 1 * CHECKPOINT_PER_BLOCK * (1 + 1 / 4), rel=1e-6)
    alone = step_seconds(CHECKPOINT_PER_BLOCK) - step_seconds(0.0)
    assert alone == pytest.approx(4 * 2 * CHECKPOINT_PER_BLOCK, rel=1e-6)


def test_recomputation_under_autocast_takes_its_own_measurement(tmp_path):
    # bf16 without FSDP2 is autocast over fp32 parameters (this plan's default precision): the
    # checkpointing's own work measured under autocast prices it; fp32 keeps the fp32 figures
    plan = plan_with(
        tmp_path,
        wrapper_profile(
            checkpoint_per_block=CHECKPOINT_PER_BLOCK,
            selective_per_block=SELECTIVE_PER_BLOCK,
            checkpoint_per_block_autocast=3 * CHECKPOINT_PER_BLOCK,
            selective_per_block_autocast=5 * SELECTIVE_PER_BLOCK,
        ),
    )
    name = "activation checkpointing's own work (measured)"
    assert plan.train.precision == "bf16"
    assert other_terms(plan, recompute="full")[name] == pytest.approx(4 * 2 * 3 * CHECKPOINT_PER_BLOCK)
    assert other_terms(plan, recompute="selective")[name] == pytest.approx(4 * 2 * 5 * SELECTIVE_PER_BLOCK)
    assert other_terms(fp32(plan), recompute="selective")[name] == pytest.approx(4 * 2 * SELECTIVE_PER_BLOCK)


def test_per_op_terms_scale_with_the_blocks_op_count(tmp_path, calibrated):
    # DTensor TP and checkpointing cost per op; calibrate measures them on planc's GPT block.
    from planc.calibrate.tp_block import SPEC
    from planc.cost.dispatch import BLOCK_OPS, DTENSOR_OPS
    from planc.cost.wrappers import MEASURED_BLOCK
    from planc.spec.model import ModelSpec

    measured = ModelSpec.model_validate(SPEC)
    assert (measured.norm, measured.mlp, measured.position) == MEASURED_BLOCK
    llama = fp32(
        calibrated.model_copy(
            update={
                "model": calibrated.model.model_copy(update={"norm": "rmsnorm", "mlp": "swiglu", "position": "rope"})
            }
        )
    )
    # Checkpointing's policy sees every aten op: a Llama block (RMSNorm, SwiGLU, RoPE) runs 98 + 152
    # against the GPT block's 47 + 101.
    assert sum(BLOCK_OPS[("rmsnorm", "swiglu", "rope")]) == 250 and sum(BLOCK_OPS[MEASURED_BLOCK]) == 148
    full = other_terms(llama, recompute="full")["activation checkpointing's own work (measured)"]
    assert full == pytest.approx(4 * 2 * CHECKPOINT_PER_BLOCK * 250 / 148)
    # DTensor's cost only the ops on DTensors: 42 + 102 in a Llama block against the GPT block's
    # 26 + 80 (the attention core, RoPE and SwiGLU's product run on local tensors), 53 outside
    assert DTENSOR_OPS[("rmsnorm", "swiglu", "rope")] == (42, 102, 53) and DTENSOR_OPS[MEASURED_BLOCK][:2] == (26, 80)
    tp = other_terms(llama, tp=2)["DTensor dispatch (measured)"]
    edges = 4 * 53 * TP_PER_BLOCK / 106
    assert tp == pytest.approx(4 * 2 * TP_PER_BLOCK * 144 / 106 + edges)
    # Recomputation reruns the forward's DTensor ops: 42 of the Llama block's 144 once more.
    rerun = other_terms(llama, tp=2, recompute="full")["DTensor dispatch (measured)"]
    assert rerun == pytest.approx((tp - edges) * (1 + 42 / 144) + edges)


def test_no_wrapper_term_without_measurement(tmp_path):
    # A profile of the previous format (no "wrappers" key) still loads, with every cost 0 ...
    old = profile_dict()
    assert "wrappers" not in old["measured"]
    assert HardwareProfile.model_validate(old).measured.wrappers.fsdp_per_unit == 0.0
    # ... and neither it nor a plan without a profile adds a term.
    for plan in (plan_with(tmp_path, old), plan_with(tmp_path, None), fp32(plan_with(tmp_path, old))):
        layouts = ({"dp": 2}, {"dp": 2, "zero": 1}, {"dp": 2, "zero": 3}, {"tp": 2}, {"pp": 2, "schedule": "1f1b"})
        for layout in layouts + ({"recompute": "full"}, {"recompute": "selective"}):
            assert not any("(measured)" in name for name in other_terms(plan, **layout))
