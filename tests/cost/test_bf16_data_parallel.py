"""bf16 data parallelism computes like FSDP (issue 12, point 1).

planc's ``ddp`` runs bf16 through FSDP2's ``replicate`` with the same ``MixedPrecisionPolicy`` as
``fsdp``: bf16 working weights and activations, fp32 master weights and optimizer states. The
cost model must therefore give DDP the compute FSDP gets for the same micro-batch and charge it
no autocast penalty (fp32 residual stream, per-linear input casts); ZeRO-1 keeps autocast.
"""

import pytest

from planc.cost import build_context, evaluate
from planc.spec import Layout, build_plan
from planc.spec.plan import PluginUse
from planc.strategies.ddp.cost_pass import REPLICATE_BYTES_PER_PARAM
from planc.strategies.registry import load_registry


def plan(precision="bf16"):
    return build_plan(
        {
            "model": {"preset": "gpt2"},
            "hardware": {"device": "A100-80GB", "per_node": 8},
            "train": {"global_batch": 480, "precision": precision},
        }
    )


def layout(zero, micro_batch=20):
    return Layout(tp=1, pp=1, dp=8, zero=zero, recompute="none", schedule=None, micro_batch=micro_batch)


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_ddp_block_compute_and_activations_equal_fsdp(zero_stage):
    p = plan()
    ddp, fsdp = build_context(p, layout(0)), build_context(p, layout(zero_stage))
    assert (ddp.compute_bytes, ddp.residual_bytes) == (fsdp.compute_bytes, fsdp.residual_bytes) == (2, 2)
    assert ddp.times == fsdp.times
    assert ddp.layer == fsdp.layer
    assert ddp.layer_act == fsdp.layer_act


def test_zero1_keeps_the_autocast_residual_stream():
    ctx = build_context(plan(), layout(1))
    assert (ctx.compute_bytes, ctx.residual_bytes) == (2, 4)
    assert ctx.layer.forward > build_context(plan(), layout(0)).layer.forward


def test_ddp_step_compute_differs_from_zero2_only_by_the_parameter_cast():
    """ZeRO-2 and DDP both run FSDP2's copy-out (2 x 2 bytes) and gradient cast (2 + 4 bytes) per
    micro-batch; only DDP casts whole fp32 parameters to bf16 (read 4 + write 2 bytes, ZeRO-2 casts
    its 1/8 shard, which planc neglects). So with m micro-batches, Psi parameters and HBM rate B:
    compute(DDP) - compute(ZeRO-2) = m x 6 Psi / B, and no autocast term remains."""
    p, registry = plan(), load_registry()
    ddp_layout, zero2_layout = layout(0), layout(2)
    ddp = evaluate(p, ddp_layout, registry.passes(p, ddp_layout))
    zero2 = evaluate(p, zero2_layout, registry.passes(p, zero2_layout))
    ctx = build_context(p, ddp_layout)
    psi = max(st.params for st in ctx.stages)
    m = ctx.micro_batches  # 480 / (8 x 20) = 3
    assert m == 3
    assert REPLICATE_BYTES_PER_PARAM == 6 + 4 + 6
    assert ddp.compute - zero2.compute == pytest.approx(m * 6 * psi / ctx.device.memory_rate, rel=1e-9)
    names = [term.name for stage in ddp.stages for term in stage.transient]
    assert not any("autocast" in name for name in names), names


def test_fp32_ddp_is_unchanged():
    """fp32 keeps DistributedDataParallel: no bf16 copies, DDP's bucket traffic."""
    p, registry = plan("fp32"), load_registry()
    est = evaluate(p, layout(0), registry.passes(p, layout(0)))
    assert build_context(p, layout(0)).state_bytes.working == 4
    assert "replicate" not in est.comm_of("dp").detail


def test_ddp_without_bf16_weights_is_costed_as_autocast():
    """``use ddp { bf16_weights = false }`` keeps DistributedDataParallel under autocast (for comm
    hooks): fp32 residual stream, fp32 working parameters, the autocast weight copies."""
    p = plan().model_copy(update={"uses": (PluginUse(name="ddp", options={"bf16_weights": False}),)})
    registry = load_registry()
    ctx = build_context(p, layout(0))
    assert (ctx.residual_bytes, ctx.state_bytes.working) == (4, 4)
    est = evaluate(p, layout(0), registry.passes(p, layout(0)))
    assert any("autocast" in term.name for stage in est.stages for term in stage.transient)


@pytest.mark.parametrize(
    ("options", "said"),
    [({"bucket": 50e6}, True), ({"bucket": 50e6, "bf16_weights": False}, False), ({}, False)],
)
def test_a_bucket_size_replicate_ignores_is_said(options, said):
    """Under bf16 ``replicate`` has no buckets, so a ``bucket`` the plan sets changes nothing; the
    estimate says so (explain prints it as a note). DistributedDataParallel (bf16_weights = false)
    uses it, and a plan that does not set it hears nothing."""
    p = plan().model_copy(update={"uses": (PluginUse(name="ddp", options=options),)})
    registry = load_registry()
    est = evaluate(p, layout(0), registry.passes(p, layout(0)))
    assert any("has no effect" in note and "bucket" in note for note in est.notes) == said
