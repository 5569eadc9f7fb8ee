"""Monotonicity of the cost model (hypothesis): what must hold for any plan and layout.

- more TP never raises per-device parameter memory;
- a higher ZeRO stage never raises model-state memory;
- more recomputation never raises activation memory;
- a longer pipeline schedule bubble never makes a step faster.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planc.cost import build_context, evaluate
from planc.spec import Layout, build_plan
from planc.strategies.registry import load_registry


def estimate(plan, layout):
    """The cost model's estimate under the strategies active in ``layout``."""
    return evaluate(plan, layout, load_registry().passes(plan, layout))


MODELS = st.sampled_from(
    [
        dict(layers=8, hidden=512, heads=8, vocab=4096, seq_len=256),
        dict(
            layers=12,
            hidden=768,
            heads=12,
            kv_heads=4,
            vocab=8000,
            seq_len=512,
            mlp="swiglu",
            norm="rmsnorm",
            position="rope",
        ),
        dict(layers=6, hidden=1024, heads=16, vocab=32000, seq_len=1024, tie_embeddings=True),
    ]
)


def plan(model, precision="bf16", optimizer="adamw"):
    return build_plan(
        {
            "model": model,
            "hardware": {"device": "A100-80GB", "nodes": 2},
            "train": {"global_batch": 64, "precision": precision, "optimizer": optimizer},
        }
    )


def lay(tp=1, pp=1, dp=16, zero=0, recompute="none", mb=1, schedule=None, sp=False):
    return Layout(
        tp=tp,
        pp=pp,
        dp=dp,
        zero=zero,
        recompute=recompute,
        schedule=schedule if pp > 1 else None,
        micro_batch=mb,
        sequence_parallel=sp,
    )


@settings(max_examples=40, deadline=None)
@given(
    MODELS,
    st.sampled_from(["bf16", "fp32"]),
    st.sampled_from([1, 2]),
    st.sampled_from([0, 1, 2, 3]),
    st.sampled_from([1, 2]),
)
def test_more_tp_never_raises_parameter_memory(model, precision, pp, zero, dp):
    # TP shards a data-parallel replica further: same pp and dp, tp devices more per replica.
    previous = None
    for tp in (1, 2, 4):
        if model["heads"] % tp or model.get("kv_heads", model["heads"]) % tp:
            continue
        world = tp * pp * dp
        p = build_plan(
            {
                "model": model,
                "hardware": {"device": "A100-80GB", "nodes": 1, "per_node": world},
                "train": {"global_batch": 64, "precision": precision},
            }
        )
        est = estimate(p, lay(tp=tp, pp=pp, dp=dp, zero=zero, schedule="1f1b", mb=1))
        params = max(s.params + s.master for s in est.stages)
        if previous is not None:
            assert params <= previous * (1 + 1e-9)
        previous = params


@settings(max_examples=40, deadline=None)
@given(MODELS, st.sampled_from(["bf16", "fp32"]), st.sampled_from(["adamw", "sgd"]), st.sampled_from([1, 2]))
def test_higher_zero_never_raises_model_states(model, precision, optimizer, tp):
    p = plan(model, precision, optimizer)
    if model["heads"] % tp:
        return
    states = [estimate(p, lay(tp=tp, dp=16 // tp, zero=z)).memory.model_states for z in (0, 1, 2, 3)]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(states, states[1:]))


@settings(max_examples=40, deadline=None)
@given(MODELS, st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.booleans(), st.sampled_from([0, 3]))
def test_more_recompute_never_raises_activation_memory(model, mb, tp, sp, zero):
    p = plan(model)
    if model["heads"] % tp or model.get("kv_heads", model["heads"]) % tp:
        return
    sp = sp and tp > 1
    acts = [
        estimate(p, lay(tp=tp, dp=16 // tp, recompute=r, mb=mb, sp=sp, zero=zero)).memory.activations
        for r in ("none", "selective", "full")
    ]
    assert acts[0] >= acts[1] >= acts[2]


@settings(max_examples=20, deadline=None)
@given(MODELS, st.sampled_from([2, 4]))
def test_interleaving_shrinks_the_bubble(model, pp):
    if pp * 2 > model["layers"]:
        return
    p = plan(model)
    one = estimate(p, Layout(tp=1, pp=pp, dp=16 // pp, zero=0, recompute="none", schedule="1f1b", micro_batch=1))
    two = estimate(
        p,
        Layout(
            tp=1, pp=pp, dp=16 // pp, zero=0, recompute="none", schedule="interleaved", micro_batch=1, virtual_stages=2
        ),
    )
    zb = estimate(p, Layout(tp=1, pp=pp, dp=16 // pp, zero=0, recompute="none", schedule="zero-bubble", micro_batch=1))
    assert two.bubble < one.bubble
    # ZB-H1 (Qi et al. 2023, Sec. 2.1): bubble (p - 1)(T_F + T_B - T_W) against 1F1B's
    # (p - 1)(T_F + T_B + T_W), their T_B the input-gradient half; with f the forward, b the whole
    # backward and w its weight half, T_B = b - w: the ratio is (f + b - 2 w) / (f + b), a third when
    # T_F = T_B = T_W.
    slow = build_context(
        p, Layout(tp=1, pp=pp, dp=16 // pp, zero=0, recompute="none", schedule="1f1b", micro_batch=1)
    ).slowest
    ratio = (slow.forward + slow.backward - 2 * slow.backward_weight) / (slow.forward + slow.backward)
    assert zb.bubble == pytest.approx(one.bubble * ratio, rel=1e-9)
    assert zb.bubble < one.bubble
