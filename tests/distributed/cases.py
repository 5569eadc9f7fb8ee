"""The equivalence matrix: tiny plans and the layouts each must reproduce the single-process losses for.

Two model families cover the architecture switches: ``gpt`` (GELU, LayerNorm with biases, learned
positions) and ``llama`` (SwiGLU, RMSNorm, RoPE, grouped-query attention with kv_heads = 2).
Every case has global batch 8 and runs 5 optimizer steps; ``micro_batch`` below the per-rank rows
means gradient accumulation.
"""

from __future__ import annotations

from planc.spec import Layout, Plan, build_plan

STEPS = 5
GLOBAL_BATCH = 8
FP32_TOLERANCE = 1e-5
#: bf16 rounds to 8 significant bits (relative 2^-8 = 0.4%); over 5 steps of a ~4.6-nat loss the
#: single-process and sharded runs round differently. 2e-2 is the bound the brief sets.
BF16_TOLERANCE = 2e-2

FAMILIES = {
    "gpt": dict(mlp="gelu", norm="layernorm", position="learned", kv_heads=4),
    "llama": dict(mlp="swiglu", norm="rmsnorm", position="rope", kv_heads=2),
}


def make_plan(
    world: int,
    family: str,
    *,
    layers: int = 4,
    tie: bool = False,
    precision: str = "fp32",
    uses: tuple = (),
    checkpoint_every: int | None = None,
) -> Plan:
    model = dict(
        layers=layers,
        hidden=32,
        heads=4,
        vocab=90,  # padded to 96: the loss must leave the 6 padding columns out on every layout
        vocab_multiple=32,
        seq_len=16,
        tie_embeddings=tie,
        **FAMILIES[family],
    )
    train = dict(global_batch=GLOBAL_BATCH, precision=precision, lr=1e-2, warmup_steps=1, steps=STEPS, seed=7)
    raw = {
        "model": model,
        "hardware": {"device": "cpu", "per_node": world},
        "train": train,
        "uses": [{"name": name, "options": options} for name, options in uses],
    }
    if checkpoint_every is not None:
        raw["checkpoint"] = {"every": checkpoint_every, "dir": "checkpoints", "keep": 1}
    return build_plan(raw)


def make_layout(**fields) -> Layout:
    values = dict(tp=1, pp=1, dp=1, zero=0, recompute="none", schedule=None, micro_batch=4)
    values.update(fields)
    return Layout(**values)


def case(
    name,
    world,
    family="gpt",
    *,
    layers=4,
    tie=False,
    precision="fp32",
    uses=(),
    same_until=None,
    resume_at=None,
    **layout,
) -> dict:
    """``same_until=k``: the case equals the reference for its first k steps, then must leave it
    (a strategy that changes the maths on purpose, e.g. gradient compression).
    ``resume_at=k``: train k steps with a checkpoint every k, then resume in a fresh job."""
    plan = make_plan(world, family, layers=layers, tie=tie, precision=precision, uses=uses, checkpoint_every=resume_at)
    return {
        "name": name,
        "world": world,
        "plan": plan,
        "same_until": same_until,
        "resume_at": resume_at,
        "layout": make_layout(**layout),
        "steps": STEPS,
        "tolerance": BF16_TOLERANCE if precision == "bf16" else FP32_TOLERANCE,
    }


CASES = [
    # -- 2 processes ------------------------------------------------------------------------------
    case("ddp2-accum", 2, "gpt", dp=2, micro_batch=2),
    case("zero1x2", 2, "llama", dp=2, zero=1),
    case("zero2x2-selective-accum", 2, "gpt", dp=2, zero=2, recompute="selective", micro_batch=2),
    case("zero3x2-full", 2, "llama", dp=2, zero=3, recompute="full"),
    case(
        "zero3x2-accum-unsharded",
        2,
        "llama",
        dp=2,
        zero=3,
        micro_batch=2,
        uses=(("fsdp", {"accumulate_unsharded": True}),),
    ),
    case("tp2-accum", 2, "gpt", tp=2),
    case("tp2-sp-gqa-selective", 2, "llama", tp=2, sequence_parallel=True, recompute="selective"),
    case("tp2-sp-learned-full", 2, "gpt", tp=2, sequence_parallel=True, recompute="full"),
    case("tp2-tied", 2, "gpt", tie=True, tp=2, sequence_parallel=True),
    case("pp2-gpipe", 2, "gpt", pp=2, schedule="gpipe", micro_batch=2),
    case("pp2-1f1b-uneven-full", 2, "llama", layers=5, pp=2, schedule="1f1b", micro_batch=2, recompute="full"),
    case(
        "pp2-interleaved-selective",
        2,
        "gpt",
        pp=2,
        schedule="interleaved",
        virtual_stages=2,
        micro_batch=2,
        recompute="selective",
    ),
    case("pp2-zero-bubble", 2, "llama", pp=2, schedule="zero-bubble", virtual_stages=2, micro_batch=2),
    case(
        "pp2-zbv",
        2,
        "gpt",
        pp=2,
        schedule="zero-bubble",
        virtual_stages=2,
        micro_batch=2,
        uses=(("pipeline", {"zero_bubble": "zbv"}),),
    ),
    case("pp2-1f1b-tied", 2, "gpt", tie=True, pp=2, schedule="1f1b", micro_batch=2),
    case("pp2-interleaved-tied", 2, "gpt", tie=True, pp=2, schedule="interleaved", virtual_stages=2, micro_batch=2),
    case("zero3x2-tied", 2, "gpt", tie=True, dp=2, zero=3),
    case("bf16-ddp2", 2, "llama", precision="bf16", dp=2, micro_batch=2),
    # The same model and micro-batch under DDP, ZeRO-1 and ZeRO-3: DDP (replicate) must save the
    # activations FSDP saves; ZeRO-1 (autocast) keeps an fp32 residual stream.
    case("bf16-ddp2-gpt", 2, "gpt", precision="bf16", dp=2),
    case("bf16-zero1x2", 2, "gpt", precision="bf16", dp=2, zero=1),
    case("bf16-zero3x2", 2, "gpt", precision="bf16", dp=2, zero=3),
    case("bf16-tp2-sp", 2, "llama", precision="bf16", tp=2, sequence_parallel=True),
    case(
        "bf16-pp2-1f1b-selective",
        2,
        "gpt",
        precision="bf16",
        pp=2,
        schedule="1f1b",
        micro_batch=2,
        recompute="selective",
    ),
    case("resume-bf16-ddp2", 2, "gpt", precision="bf16", dp=2, micro_batch=2, resume_at=3),
    case(
        "resume-pp2-interleaved", 2, "llama", pp=2, schedule="interleaved", virtual_stages=2, micro_batch=2, resume_at=3
    ),
    # -- 4 processes ------------------------------------------------------------------------------
    case("resume-tp2-dp2-zero1-sp", 4, "llama", tp=2, dp=2, zero=1, sequence_parallel=True, resume_at=3),
    case("resume-tp2-dp2-zero3", 4, "gpt", tp=2, dp=2, zero=3, resume_at=3),
    # HSDP: shard over pairs of dp ranks, replicate across the two pairs (FSDP2 on a 2-D mesh).
    case("hsdp2x2-zero3-accum", 4, "llama", dp=4, zero=3, shard_group=2, micro_batch=1),
    case(
        "resume-bf16-hsdp2x2-zero2", 4, "gpt", precision="bf16", dp=4, zero=2, shard_group=2, micro_batch=2, resume_at=3
    ),
    case("tp2-dp2-ddp-sp", 4, "llama", tp=2, dp=2, sequence_parallel=True, micro_batch=2),
    case("tp2-dp2-zero1", 4, "gpt", tp=2, dp=2, zero=1),
    case("tp2-dp2-zero3-selective", 4, "gpt", tp=2, dp=2, zero=3, recompute="selective"),
    case("pp2-dp2-ddp-1f1b-full", 4, "llama", pp=2, dp=2, schedule="1f1b", micro_batch=2, recompute="full"),
    case(
        "pp2-dp2-zero2-interleaved",
        4,
        "gpt",
        pp=2,
        dp=2,
        zero=2,
        schedule="interleaved",
        virtual_stages=2,
        micro_batch=1,
    ),
    case(
        "pp2-dp2-zero2-zero-bubble",
        4,
        "llama",
        pp=2,
        dp=2,
        zero=2,
        schedule="zero-bubble",
        virtual_stages=2,
        micro_batch=1,
    ),
    case("pp2-dp2-zero3-tied-gpipe", 4, "gpt", tie=True, pp=2, dp=2, zero=3, schedule="gpipe", micro_batch=2),
    case("bf16-tp2-dp2-ddp-sp", 4, "llama", precision="bf16", tp=2, dp=2, sequence_parallel=True, micro_batch=2),
    case("bf16-pp2-dp2-zero3", 4, "llama", precision="bf16", pp=2, dp=2, zero=3, schedule="1f1b", micro_batch=2),
    case(
        "pp2-tp2-1f1b-sp-selective",
        4,
        "llama",
        pp=2,
        tp=2,
        schedule="1f1b",
        sequence_parallel=True,
        micro_batch=2,
        recompute="selective",
    ),
    # -- 8 processes ------------------------------------------------------------------------------
    case(
        "pp2-tp2-dp2-zero3-sp-full",
        8,
        "llama",
        pp=2,
        tp=2,
        dp=2,
        zero=3,
        schedule="1f1b",
        sequence_parallel=True,
        micro_batch=2,
        recompute="full",
    ),
    case(
        "pp2-tp2-dp2-zero1-tied-sp",
        8,
        "gpt",
        tie=True,
        pp=2,
        tp=2,
        dp=2,
        zero=1,
        schedule="1f1b",
        sequence_parallel=True,
        micro_batch=2,
    ),
    case(
        "pp2-tp2-dp2-ddp-interleaved",
        8,
        "gpt",
        pp=2,
        tp=2,
        dp=2,
        schedule="interleaved",
        virtual_stages=2,
        micro_batch=1,
        recompute="selective",
    ),
]


def powersgd_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("planc_powersgd") is not None


if powersgd_installed():
    # The third-party plugin (plugins/planc-powersgd) through the same registry as the built-ins.
    # Before start_iter PowerSGD's hook is a plain all-reduce; from then on it compresses, and
    # the losses must leave the reference: step k's loss reflects the updates of steps 1..k-1,
    # so with start_iter = 2 (updates 1 and 2 plain) steps 1-3 match and steps 4-5 do not.
    CASES += [
        case(
            "powersgd-before-start", 2, "gpt", dp=2, micro_batch=2, uses=(("powersgd", {"rank": 1, "start_iter": 100}),)
        ),
        case(
            "powersgd-compressing",
            2,
            "gpt",
            dp=2,
            micro_batch=2,
            same_until=3,
            uses=(("powersgd", {"rank": 1, "start_iter": 2}),),
        ),
        # ZeRO-1 wraps the model in DDP too: the hook compresses its gradients (the cost pass
        # compresses ZeRO-1's gradient all-reduce, not its parameter broadcast).
        case(
            "powersgd-zero1-compressing",
            2,
            "gpt",
            dp=2,
            zero=1,
            micro_batch=2,
            same_until=3,
            uses=(("powersgd", {"rank": 1, "start_iter": 2}),),
        ),
    ]
