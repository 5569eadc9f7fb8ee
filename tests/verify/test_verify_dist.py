"""``planc verify``'s measurements against the cost model, on 2 CPU processes: DDP, ZeRO-1, FSDP, TP, TP + SP, PP.

One launch trains the six cases 4 steps each under the probe (tests/verify/ranks_verify.py);
then, here, :func:`planc.commands.verify.collect` puts the prediction beside every rank's numbers.
The goals of issue 13 are model states within 1%, saved activations within 10% and communication
within 2% (bench/verify_matrix.py prints them); these bounds are looser, the measurement exact
in its own terms: model-state bytes are storage sizes, activations what autograd saved, traffic
every collective the step issued.
"""

from __future__ import annotations

import pytest
from ranks import run_ranks

from planc.commands.verify import collect
from planc.spec import build_plan
from planc.strategies.registry import load_registry

TINY = {"layers": 2, "hidden": 64, "heads": 4, "vocab": 128, "seq_len": 32}
CASES = {
    "ddp": {"tp": 1, "pp": 1, "dp": 2, "zero": 0},
    # the parameter sync after the step: one broadcast per rank's buffer (bucket views), not one per tensor
    "zero1": {"tp": 1, "pp": 1, "dp": 2, "zero": 1},
    "fsdp": {"tp": 1, "pp": 1, "dp": 2, "zero": 3},
    "tp": {"tp": 2, "pp": 1, "dp": 1, "sequence_parallel": False},
    # bf16 under autocast with sequence parallelism: the pack hook meets functional collectives in
    # flight (an AsyncCollectiveTensor, no storage of its own), which crashed verify before
    "tp-sp-bf16": {"tp": 2, "pp": 1, "dp": 1, "sequence_parallel": True},
    # tied embeddings across the pipeline: the first and the last stage sum the embedding's gradient
    # over a group of their own, which verify counted as "other", 0 bytes, and the model left out
    "pp-tied": {"tp": 1, "pp": 2, "dp": 1, "schedule": "1f1b"},
    # a third-party DDP communication hook (plugins/planc-powersgd): its P and Q all-reduces are
    # issued from gloo's thread, in the futures' callbacks, which the counter missed at first; and it
    # compresses only after start_iter steps, which verify runs unmeasured first (steady_after)
    "ddp-powersgd": {"tp": 1, "pp": 1, "dp": 2, "zero": 0},
    # two chunks per rank: the peak's tracker cleared every module's statistics at each chunk's
    # forward, and a chunk's later backward crashed verify (KeyError); zero-bubble's split backward
    # cannot be followed by the tracker's module hooks at all (autograd.grad on a leaf)
    "pp-interleaved": {"tp": 1, "pp": 2, "dp": 1, "schedule": "interleaved", "virtual_stages": 2},
    "pp-zero-bubble": {"tp": 1, "pp": 2, "dp": 1, "schedule": "zero-bubble", "virtual_stages": 2},
    # FSDP with one micro-batch per step: its sharded gradients (None since the last step) do not
    # exist yet at the forward's end, where the step peaks; priced as held, the peak read +15 %
    "fsdp-one-micro-batch": {"tp": 1, "pp": 1, "dp": 2, "zero": 3},
}
GLOBAL_BATCH = {"fsdp-one-micro-batch": 4}
#: peak memory, where it is held here (predicted net of the allocator margin, MemTracker's peak)
PEAK_BOUNDS = {"ddp-powersgd": 0.05, "pp-interleaved": 0.06, "pp-zero-bubble": 0.06, "fsdp-one-micro-batch": 0.06}
USES = {"ddp-powersgd": [{"name": "powersgd", "options": {"rank": 2, "start_iter": 3}}]}
PRECISION = {"tp-sp-bf16": "bf16"}
LLAMA_BLOCK = {"norm": "rmsnorm", "mlp": "swiglu", "position": "rope", "kv_heads": 2}  # where the crash was
FOUR_BLOCKS = {**TINY, "layers": 4}  # two chunks of one block on each of 2 pipeline ranks
MODEL = {
    "tp-sp-bf16": {**TINY, **LLAMA_BLOCK},
    "pp-tied": {**TINY, "tie_embeddings": True},
    "pp-interleaved": FOUR_BLOCKS,
    "pp-zero-bubble": FOUR_BLOCKS,
}
BOUNDS = {"model states": 0.02, "saved activations": 0.15, "communication": 0.05}


def _plan(
    layout: dict,
    precision: str = "fp32",
    model: dict | None = None,
    uses: list | None = None,
    global_batch: int = 8,
    per_node: int = 2,
):
    return build_plan(
        {
            "model": model or TINY,
            "hardware": {"device": "cpu", "nodes": 1, "per_node": per_node},
            "train": {"global_batch": global_batch, "micro_batch": 2, "precision": precision, "steps": 10},
            "layout": {**layout, "recompute": "none"},
            "uses": uses or [],
        },
        source="verify-test",
    )


@pytest.mark.dist
def test_measured_model_states_activations_and_traffic_match_the_prediction(tmp_path):
    from planc.planner import choose

    registry = load_registry()
    names = [name for name in CASES if name not in USES or all(use["name"] in registry for use in USES[name])]
    plans = {
        name: _plan(
            CASES[name], PRECISION.get(name, "fp32"), MODEL.get(name), USES.get(name), GLOBAL_BATCH.get(name, 8)
        )
        for name in names
    }
    chosen = {name: choose(plans[name], registry) for name in names}
    unmeasured = {
        name: max(registry.steady_after(plans[name], chosen[name].layout).values(), default=0) for name in names
    }
    assert unmeasured.get("ddp-powersgd", 3) == 3  # start_iter
    cases = [
        {
            "plan": plans[name].model_dump(mode="json", exclude_computed_fields=True),
            "layout": choice.layout.model_dump(mode="json"),
            "out_dir": str(tmp_path / name),
            "unmeasured": unmeasured[name],
        }
        for name, choice in chosen.items()
    ]
    run_ranks("tests/verify/ranks_verify.py:measure", 2, cases)
    for name, choice in chosen.items():
        result = collect(plans[name], choice.layout, registry, tmp_path / name)
        rows = result["rows"]
        sections = {row["section"] for row in rows if row["error"] is not None}
        # every quantity was measured on both ranks
        assert {"model states", "saved activations", "communication", "peak memory", "step time"} <= sections, name
        assert {row["rank"] for row in rows} == {0, 1}
        for row in rows:
            bound = BOUNDS.get(row["section"])
            if bound is not None and row["error"] is not None:
                assert abs(row["error"]) <= bound, (name, row)
        # the traffic went where the layout says: data parallelism moves gradients over "dp",
        # tensor parallelism activations over "tp"
        groups = {row["name"] for row in rows if row["section"] == "communication" and row["measured"]}
        assert groups == {name.split("-")[0] if name.startswith(("tp", "pp")) else "dp"}, (name, groups)
        # no collective of the step went to a group verify cannot name (and so could not size)
        assert not [row for row in rows if row["section"] == "communication" and row["name"] == "other"], name
    # PowerSGD's error-feedback residuals (the plugin prices one per gradient) exist from its first
    # compressing step, before the tracker starts: verify tells it of the hook's state (18% low before)
    for name, bound in PEAK_BOUNDS.items():
        if name in chosen:
            result = collect(plans[name], chosen[name].layout, registry, tmp_path / name)
            peaks = [row for row in result["rows"] if row["section"] == "peak memory"]
            assert peaks and all(abs(row["error"]) <= bound for row in peaks), (name, peaks)
    # ZeRO-1: each of the 2 ranks broadcasts its parameters' buffer once per step; torch's default
    # broadcast the model's 37 parameter tensors one at a time
    for record in collect(plans["zero1"], chosen["zero1"].layout, registry, tmp_path / "zero1")["ranks"]:
        broadcasts = [entry for entry in record["comm"] if entry["kind"] == "broadcast"]
        assert [(entry["group"], entry["calls"]) for entry in broadcasts] == [("dp", 2)]


@pytest.mark.dist
def test_collectives_issued_in_future_callbacks_are_counted_once():
    """A DDP communication hook chains collectives with ``Future.then`` (PowerSGD's P and Q), whose
    callbacks run in gloo's thread, where a dispatch mode does not reach: they are counted there,
    and a callback that runs inline (its future had completed) is not counted twice. Bytes as the
    cost model states an all-reduce's over 2 ranks: 2 (p - 1) / p x 4 bytes per element."""
    counted = run_ranks("tests/verify/ranks_verify.py:count_callbacks", 2)
    key = str(("all_reduce", "world"))
    assert counted["in gloo's thread"] == {key: 4.0 * (10 + 30)}
    assert counted["inline"] == {key: 4.0 * (10 + 20)}


@pytest.mark.dist
def test_hsdp_traffic_is_counted_on_the_data_parallel_dimension(tmp_path):
    """HSDP unflattens the "dp" ranks into replicate x shard groups of their own, which verify named
    "other" (no prediction beside them, "dp" reading 0): they are data parallelism's. 4 processes:
    shard groups of 2, replicated twice; gradients reduce-scattered in the pairs, all-reduced across."""
    from planc.planner import choose

    registry = load_registry()
    plan = _plan({"tp": 1, "pp": 1, "dp": 4, "zero": 3, "shard_group": 2}, per_node=4)
    layout = choose(plan, registry).layout
    case = {"plan": plan.model_dump(mode="json", exclude_computed_fields=True), "out_dir": str(tmp_path / "hsdp")}
    run_ranks("tests/verify/ranks_verify.py:measure", 4, [case | {"layout": layout.model_dump(mode="json")}])
    rows = collect(plan, layout, registry, tmp_path / "hsdp")["rows"]
    traffic = [row for row in rows if row["section"] == "communication"]
    assert {row["name"] for row in traffic if row["measured"]} == {"dp"}
    assert all(abs(row["error"]) <= BOUNDS["communication"] for row in traffic if row["error"] is not None)
