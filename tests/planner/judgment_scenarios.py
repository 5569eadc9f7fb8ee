"""Scenarios from published practice and the layout an expert would accept for each.

Each scenario is a plan with the layout left to the planner (``auto``), the source it was
written from, and a predicate on the chosen layout that an experienced distributed-training
engineer would accept -- not the published layout itself (several layouts are defensible), but
the line the published practice draws ("tp == 8 and pp >= 8", "no model parallelism").
Scenarios named ``run:<id>`` take model, hardware and batch from ``tests/data/published_runs.json``
(each family there carries its citation); the published layout and micro-batch are dropped.

``needs`` names why planc's choice differs from the expert's line: the test marks such a
scenario ``xfail(strict=False)`` with that reason (a disagreement argued in docs/accuracy.md, or
an open cost-model question).

Used by tests/planner/test_judgment.py and bench/judgment_table.py (the before/after table).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "published_runs.json"
TP_EXPOSED = (
    "planc disagrees, with numbers (docs/cost-model.md, 'TP 4 or TP 8'): planc's eager DTensor TP does not "
    "overlap its collectives, so TP 8's exposed TP time is (8-1)/(4-1) = 2.3x TP 4's for the same work per "
    "device, and ZeRO-2 lets TP 4 fit where Megatron-LM 2021 (no distributed optimizer) needed TP 8; the TP "
    "cost is right for such programs (Narayanan Table 1, TP 1..8 on A100: errors flat, +4%/+3%/-0%/+1%). "
)


def tp_exposed(numbers: str) -> str:
    """:data:`TP_EXPOSED` with the scenario's own numbers."""
    return TP_EXPOSED + numbers


SIMPLER_AND_ROOMIER = (
    "planc's fastest layout is the published kind, TP 8 x PP 4 x DP 2 (ZeRO-2, 1F1B, selective + SP, 14.48 s), "
    "but at 74.6 of 76.0 GiB on its first stage (with the whole-vocabulary embedding gradient that "
    "planc verify --simulate found); TP 2 x ZeRO-3 over 32 (15.45 s, +6.7%, within the model's uncertainty) "
    "is simpler and leaves room, so the rule takes it"
)


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str
    expect: str
    """The predicate in words (what the test reports on failure)."""
    accept: Callable[..., bool]
    """accept(layout) -> bool, or with ``on_choice`` accept(choice) -> bool"""
    plan: dict = field(default_factory=dict)
    needs: str | None = None
    on_choice: bool = False


def _run(run_id: str) -> dict:
    runs = {r["id"]: r for r in json.loads(DATA.read_text(encoding="utf-8"))["runs"]}
    r = runs[run_id]
    train = {"precision": "bf16", **{k: v for k, v in r["train"].items() if k != "micro_batch"}}
    return {"model": dict(r["model"]), "hardware": {k: _quantity(v) for k, v in r["hardware"].items()}, "train": train}


def _quantity(value):
    """'95 GiB' -> Quantity, as the .plan reader makes it (bench/accuracy.py does the same)."""
    from planc.units import Quantity

    if isinstance(value, str) and " " in value:
        number, unit = value.split()
        return Quantity.of(float(number), unit)
    return value


def published(run_id: str, expect: str, accept: Callable[..., bool], needs: str | None = None) -> Scenario:
    """A scenario built from a published run (its family's ``source`` is the citation)."""
    return Scenario(f"run:{run_id}", f"tests/data/published_runs.json {run_id}", expect, accept, _run(run_id), needs)


def _no_model_parallelism(lay) -> bool:
    return lay.tp == 1 and lay.pp == 1


SCENARIOS: list[Scenario] = [
    # -- small models: plain data parallelism ------------------------------------------------------
    Scenario(
        "nanogpt-gpt2-124m-8xa100",
        # Karpathy, nanoGPT README and config/train_gpt2.py: GPT-2 124M on one 8 x A100 40GB node with
        # DDP (torchrun --nproc_per_node=8), batch_size 12 x block 1024 x 40 accumulation = 480 sequences.
        "nanoGPT config/train_gpt2.py (DDP on 8 x A100 40GB)",
        "DDP or ZeRO-1, no model parallelism",
        lambda lay: _no_model_parallelism(lay) and lay.zero <= 1,
        {
            "model": {"preset": "gpt2"},
            "hardware": {"device": "A100-40GB", "nodes": 1, "per_node": 8},
            "train": {"global_batch": 480, "precision": "bf16"},
        },
    ),
    Scenario(
        "gpt3-xl-1.3b-8xa100",
        # plans/gpt3-1.3b-8xa100.plan (Brown et al. 2020, Table 2.1): 1.4 B parameters x 16 bytes of
        # mixed-precision Adam states = 23 GB (ZeRO paper, Rajbhandari et al. 2019, Sec. 3.1) fit an
        # 80 GB device: replicated data parallelism is the simplest layout that fits.
        "Brown et al. 2020 Table 2.1; ZeRO paper Sec. 3.1 (16 bytes per parameter)",
        "DDP or ZeRO-1",
        lambda lay: _no_model_parallelism(lay) and lay.zero <= 1,
        {
            "model": {"layers": 24, "hidden": 2048, "heads": 16, "vocab": 50257, "seq_len": 2048},
            "hardware": {"device": "A100-80GB", "nodes": 1, "per_node": 8},
            "train": {"global_batch": 512, "precision": "bf16"},
        },
    ),
    Scenario(
        "tiny-237k-4cpu",
        # Issue 12 point 2: a 237 k-parameter model on 4 CPU processes got ZeRO-2 for a 0.7 ms (8%)
        # predicted gain. PyTorch's DDP tutorial ("Getting Started with Distributed Data Parallel"):
        # DDP is the default for a model that fits one device.
        "issue 12 point 2; PyTorch DDP tutorial",
        "DDP",
        lambda lay: lay.dp == 4 and lay.zero == 0,
        {
            "model": {
                "layers": 4,
                "hidden": 64,
                "heads": 4,
                "vocab": 256,
                "seq_len": 64,
                "mlp": "gelu",
                "norm": "layernorm",
                "position": "learned",
            },
            "hardware": {"device": "cpu", "nodes": 1, "per_node": 4},
            "train": {"global_batch": 16, "precision": "fp32"},
        },
    ),
    Scenario(
        "mpt-7b-440xa100-40gb",
        # MosaicML, "Introducing MPT-7B" (2023-05-05): trained on 440 A100-40GB GPUs with FSDP (no tensor
        # or pipeline parallelism), global batch 1760 sequences of 2048 tokens. Model as in
        # tests/data/published_runs.json llm-foundry-a100-40gb/mpt-7b-*.
        "MosaicML MPT-7B blog (440 x A100-40GB, FSDP, batch 1760)",
        "sharded data parallelism, no model parallelism",
        _no_model_parallelism,
        {
            "model": {
                "layers": 32,
                "hidden": 4096,
                "heads": 32,
                "ffn": 16384,
                "vocab": 50368,
                "seq_len": 2048,
                "mlp": "gelu",
                "norm": "layernorm",
                "tie_embeddings": True,
                "bias": False,
            },
            "hardware": {"device": "A100-40GB", "nodes": 55, "per_node": 8},
            "train": {"global_batch": 1760},
        },
    ),
    published(
        "llm-foundry-a100-40gb/mpt-760m-s2048-8gpu-mb12x4",
        "no model parallelism (llm-foundry: FSDP over 8)",
        _no_model_parallelism,
    ),
    published(
        "llm-foundry-a100-40gb/mpt-13b-s2048-64gpu-mb16x1",
        "no model parallelism (llm-foundry: FSDP over 64)",
        _no_model_parallelism,
    ),
    published(
        "llm-foundry-h100/mpt-30b-s2048-128gpu-mb8x1",
        "no pipeline, TP at most 2 (llm-foundry: FSDP over 128)",
        lambda lay: lay.pp == 1 and lay.tp <= 2,
    ),
    # -- torchtitan (FSDP2 and TP) ----------------------------------------------------------------
    published(
        "torchtitan-a100/llama3-8b-sac-op",
        "no model parallelism (torchtitan llama3_8b: FSDP)",
        _no_model_parallelism,
    ),
    published(
        "torchtitan-a100/llama2-13b-sac-op",
        "no model parallelism (torchtitan: FSDP over 64)",
        _no_model_parallelism,
    ),
    published(
        "torchtitan-h100/llama3.1-8b-fsdp128",
        "no model parallelism (torchtitan: FSDP over 128)",
        _no_model_parallelism,
    ),
    published(
        "torchtitan-a100/llama2-70b-sac-op",
        "no pipeline; FSDP alone or with TP 8 (torchtitan llama3_70b: TP 8 + FSDP; the A100 runs: FSDP 64)",
        lambda lay: lay.pp == 1 and (lay.tp == 1 and lay.zero == 3 or lay.tp == 8),
        needs=tp_exposed(
            "Here the fastest TP 8 layout, TP 8 x PP 2 x DP 4 interleaved, is +11.0% over the best (TP 4 x PP 8 "
            "interleaved, 9.69 s; TP exposed 1.37 s vs 0.48 s), and TP 2 x ZeRO-3 over 32 (+10.1%, saving the best "
            "9.2% of its step, within the band) is simpler; FSDP 64 (+26.4%) does not come within it"
        ),
    ),
    published(
        "torchtitan-h100/llama3.1-405b-fsdp16-tp8",
        "tp == 8 (torchtitan llama3_405b: TP 8 x FSDP 16)",
        lambda lay: lay.tp == 8,
        needs=tp_exposed(
            "Here TP 8 x FSDP 16 is +4.3% over TP 4 x FSDP 32 (14.93 s; TP exposed 1.64 vs 0.70 s) and less simple. "
            "torchtitan's TP 8 row ran without async TP ('Optimizations: None', docs/performance.md at 877991a) "
            "and no TP 4 layout was reported: the two are within the model's uncertainty, where the simpler is taken"
        ),
    ),
    # -- Megatron-LM (Narayanan et al. 2021, Table 1; Megatron-Core H100 table) --------------------
    published(
        "narayanan2021-table1/1.7B",
        "no model parallelism (published TP 1 x PP 1)",
        _no_model_parallelism,
    ),
    published(
        "narayanan2021-table1/3.6B",
        "no pipeline, TP at most 2 (published TP 2)",
        lambda lay: lay.pp == 1 and lay.tp <= 2,
    ),
    published(
        "narayanan2021-table1/7.5B",
        "no pipeline, TP at most 4 (published TP 4)",
        lambda lay: lay.pp == 1 and lay.tp <= 4,
    ),
    published("narayanan2021-table1/18.4B", "no pipeline (published TP 8 x PP 1)", lambda lay: lay.pp == 1),
    published(
        "narayanan2021-table1/39.1B",
        "pp <= 2 (published TP 8 x PP 2)",
        lambda lay: lay.pp <= 2,
    ),
    published(
        "narayanan2021-table1/145.6B",
        "tp == 8 (published TP 8 x PP 8)",
        lambda lay: lay.tp == 8,
        # Agrees since zero-bubble with selective recompute left the search (torch refuses it at the
        # first step): the faster layouts it kept in the reference were TP 4 x PP 8 zero-bubble + selective.
    ),
    published(
        "narayanan2021-table1/310.1B",
        "tp == 8 and pp >= 8 (published TP 8 x PP 16)",
        lambda lay: lay.tp == 8 and lay.pp >= 8,
        needs=tp_exposed(
            "Here the fastest is TP 4 x PP 16 x DP 30 interleaved + selective (23.73 s; TP exposed 0.83 s), the "
            "fastest TP 8, TP 8 x PP 8 interleaved (v = 8) + selective, is +2.5% (TP exposed 1.88 s), and TP 4 x PP 16 "
            "1F1B (+10.3%) is simpler and within the band (9.4% since llm-foundry's runs are priced with their fused "
            "cross-entropy)"
        ),
    ),
    published(
        "narayanan2021-table1/1008.0B",
        "tp == 8 and pp >= 16 (published TP 8 x PP 64)",
        lambda lay: lay.tp == 8 and lay.pp >= 16,
    ),
    published(
        "narayanan2021-table2-ptdp/175B-384gpu",
        "tp == 8 and pp >= 4 (published TP 8 x PP 12; Table 2: PTD-P beats ZeRO-3 at this scale)",
        lambda lay: lay.tp == 8 and lay.pp >= 4,
        needs=tp_exposed(
            "Here TP 8 x PP 6 (interleaved) is +3.2% over the best (TP 4 x PP 16, interleaved, 47.54 s; TP exposed "
            "4.57 vs 1.84 s), and TP 2 x ZeRO-3 over 192 (+3.9%) is simpler (ZeRO-3 over all 384: +10.5%): "
            "ZeRO-3 at that scale is the optimistic regime of issue 12 point 4"
        ),
    ),
    published(
        "korthikanti2022/175B-sp-selective",
        "tp == 8 and pp >= 4 (published TP 8 x PP 8 on 64 GPUs)",
        lambda lay: lay.tp == 8 and lay.pp >= 4,
        needs=SIMPLER_AND_ROOMIER,
    ),
    published(
        "mt-nlg-2022/530B-280nodes",
        "tp == 8 and pp >= 16 (published TP 8 x PP 35)",
        lambda lay: lay.tp == 8 and lay.pp >= 16,
        # planc picks TP 8 x PP 35 x DP 8, 1F1B, the published layout (33.56 s, at 55.6 GiB), over the
        # fastest, TP 8 x PP 14 interleaved (v = 4) with selective recomputation (32.45 s): simpler,
        # within the margin, and faster and roomier than TP 8 x PP 14 1F1B (34.07 s, 73.3 GiB), which
        # the pick took while it ranked the pipeline's depth as complexity. (Zero-bubble, 30.48 s at
        # 75.5 GiB before its input gradients were counted, no longer fits.)
    ),
    published(
        "megatron-core-h100/1.7B",
        "no model parallelism (published TP 1 x PP 1, distributed optimizer)",
        _no_model_parallelism,
    ),
    published(
        "megatron-core-h100/462B",
        "tp == 8 and pp >= 8 (published TP 8 x PP 16)",
        lambda lay: lay.tp == 8 and lay.pp >= 8,
    ),
    # -- Llama 3, BLOOM -----------------------------------------------------------------------------
    published(
        "llama3-paper/405b-16384gpu",
        "tp == 8 and pp >= 8 (Llama 3 paper Table 4: TP 8 x PP 16)",
        lambda lay: lay.tp == 8 and lay.pp >= 8,
    ),
    Scenario(
        "bloom-176b-384xa100",
        # BigScience, "BLOOM: A 176B-Parameter Open-Access Multilingual Language Model", arXiv 2211.05100,
        # Sec. 3.4 and Table 3: 384 A100-80GB (48 nodes), 70 layers, hidden 14336, 112 heads, vocabulary
        # 250,680, sequence 2048, global batch 2048, trained with TP 4 x PP 12 x DP 8 and ZeRO-1.
        # (ALiBi is built as learned positions here: the same parameters within 0.02%, the same FLOPs.)
        "BLOOM paper arXiv 2211.05100 Sec. 3.4 (TP 4 x PP 12 x DP 8, 384 A100-80GB)",
        "tensor and pipeline parallelism: tp >= 4 and pp >= 4",
        lambda lay: lay.tp >= 4 and lay.pp >= 4,
        {
            "model": {"layers": 70, "hidden": 14336, "heads": 112, "vocab": 250680, "seq_len": 2048},
            "hardware": {"device": "A100-80GB", "nodes": 48, "per_node": 8},
            "train": {"global_batch": 2048},
        },
    ),
    # -- judgment without a published layout ---------------------------------------------------------
    Scenario(
        "llama3-8b-on-1-h100",
        # 8 B parameters x 16 bytes of mixed-precision Adam (ZeRO paper Sec. 3.1) = 128 GB > 80 GB: no
        # layout of one H100 fits, and the planner must say so (fits False) with a larger cluster.
        "ZeRO paper Sec. 3.1 (16 bytes per parameter)",
        "does not fit; suggests more devices",
        lambda choice: not choice.fits and choice.suggestion is not None and choice.suggestion.nodes is not None,
        {
            "model": {"preset": "llama3-8b", "seq_len": 4096},
            "hardware": {"device": "H100-SXM", "nodes": 1, "per_node": 1},
            "train": {"global_batch": 8},
        },
        on_choice=True,
    ),
]
