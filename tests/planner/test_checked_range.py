"""Issue 12 point 4 and "say how sure it is": sharded data parallelism past every published run the
cost model was checked on is set aside when a checked layout fits, and explain says so.

The expectations come from the published data (tests/data/published_runs.json), not from the code
under test: the in-goal held-out families shard over at most 512 ranks, and the only sharded runs
beyond are Narayanan et al. 2021 Table 2's ZeRO-3 rows (384-1536 ranks, out of the goal).
"""

import json
from pathlib import Path

from planc.cost.uncertainty import sharded_dp_beyond, sharded_dp_checked_by, sharded_dp_frontier, sharded_dp_within
from planc.explain.advice_words import advice_text
from planc.planner import choose
from planc.planner.advice import advise
from planc.planner.checked import sharded_regime, unchecked
from planc.spec import build_plan
from planc.strategies.registry import load_registry

REGISTRY = load_registry()
DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "published_runs.json").read_text())
GPT3_175B = {
    "layers": 96,
    "hidden": 12288,
    "heads": 96,
    "vocab": 51200,
    "seq_len": 2048,
    "mlp": "gelu",
    "norm": "layernorm",
    "position": "learned",
}


def _in_goal_sharded_dp_sizes() -> list[int]:
    families = DATA["families"]
    return [
        r["layout"]["dp"]
        for r in DATA["runs"]
        if families[r["family"]]["split"] == "test"
        and families[r["family"]].get("in_goal", True)
        and r["layout"].get("zero", 0) >= 2
        and isinstance(r["layout"].get("dp"), int)
    ]


def gpt3_plan(nodes: int, layout: dict, **train) -> object:
    return build_plan(
        {
            "model": GPT3_175B,
            "hardware": {"device": "A100-80GB", "nodes": nodes, "per_node": 8},
            "train": {"global_batch": 1536, **train},
            "layout": layout,
        }
    )


def test_the_frontier_comes_from_in_goal_runs_within_the_bound():
    frontier = sharded_dp_frontier()
    assert frontier, "run `python bench/accuracy.py --write-stats`"
    largest = max(_in_goal_sharded_dp_sizes())
    assert largest == 512  # llm-foundry's 512-GPU FSDP runs
    assert max(r.shard_ranks for r in frontier) <= largest
    for run in frontier:
        family = DATA["families"][run.run.split("/")[0]]
        assert family["split"] == "test" and family.get("in_goal", True)
        assert abs(run.error) <= sharded_dp_within()
    # What lies beyond is Narayanan's Table 2 ZeRO-3 (out of the goal), 1.4x to 3.6x too fast.
    beyond = sharded_dp_beyond()
    assert {r.run.split("/")[0] for r in beyond} == {"narayanan2021-table2-zero3"}
    assert sorted(r.shard_ranks for r in beyond) == [384, 768, 1536]
    assert all(r.error > 0.3 for r in beyond)


def test_checked_means_some_run_sharded_over_as_many_ranks():
    widest = max(sharded_dp_frontier(), key=lambda r: r.shard_ranks)
    assert sharded_dp_checked_by(widest.shard_ranks) == widest
    assert sharded_dp_checked_by(8) is not None
    assert sharded_dp_checked_by(widest.shard_ranks + 1) is None  # more ranks than any check


def test_ddp_zero1_and_cpu_plans_are_never_flagged():
    p = gpt3_plan(192, {"tp": 8, "pp": 12, "dp": 16, "zero": 1, "recompute": "full"})
    choice = choose(p, REGISTRY)
    assert sharded_regime(choice.layout, choice.estimate) is None
    cpu = build_plan(
        {
            "model": {"layers": 2, "hidden": 32, "heads": 2, "vocab": 64, "seq_len": 16},
            "hardware": {"device": "cpu", "per_node": 4},
            "train": {"global_batch": 8},
            "layout": {"dp": 4, "zero": 3},
        }
    )
    choice = choose(cpu, REGISTRY)
    assert not unchecked(cpu, choice.layout, choice.estimate)


def test_a_fixed_zero3_over_1536_ranks_is_warned_about():
    # Narayanan 2021 Table 2's last ZeRO-3 row, as a plan: 1536 ranks, one sequence each.
    p = gpt3_plan(192, {"tp": 1, "pp": 1, "dp": 1536, "zero": 3, "recompute": "full"}, micro_batch=1)
    choice = choose(p, REGISTRY)
    assert choice.fixed
    notes = [a for a in advise(p, choice, REGISTRY) if a.kind == "unchecked"]
    assert len(notes) == 1
    text = advice_text(notes[0])
    assert text.startswith("warning:") and "1536 ranks" in text and "the plan fixes it" in text
    assert "narayanan2021-table2-zero3" in text
    # explain --json says the same in its uncertainty object.
    from planc.explain.report import to_dict

    uncertainty = to_dict(p, choice)["uncertainty"]
    assert uncertainty["checked"] is False
    assert uncertainty["sharded_dp"]["shard_ranks"] == 1536 and uncertainty["sharded_dp"]["checked_up_to_ranks"] == 512


def test_the_planner_sets_aside_an_unchecked_layout_when_a_checked_one_fits():
    # Llama 3 8B on 768 H100s, two sequences each: the rule's pick, ZeRO-2 over all 768 ranks,
    # shards over more ranks than any checked run; HSDP (shard inside each node) is checked.
    p = build_plan(
        {
            "model": {"preset": "llama3-8b", "seq_len": 4096},
            "hardware": {"device": "H100-SXM", "nodes": 96, "per_node": 8},
            "train": {"global_batch": 1536},
        }
    )
    choice = choose(p, REGISTRY)
    assert not unchecked(p, choice.layout, choice.estimate)
    assert choice.layout.shard_group == 8  # HSDP: what torchtitan and MosaicML reach for at this scale
    aside = choice.set_aside
    assert aside is not None and aside.layout.shard_degree == 768 and unchecked(p, aside.layout, aside.estimate)
    notes = [a for a in advise(p, choice, REGISTRY) if a.kind == "unchecked"]
    assert len(notes) == 1 and advice_text(notes[0]).startswith("note: the rule would pick")
    assert "768 ranks" in advice_text(notes[0])


def test_when_nothing_checked_fits_the_choice_is_made_and_warned_about():
    # 1536 ranks of pure data parallelism: every fitting layout shards over 1536 ranks.
    p = gpt3_plan(192, {"tp": 1, "pp": 1})
    choice = choose(p, REGISTRY)
    assert choice.fits and choice.layout.dp == 1536 and choice.set_aside is None
    assert unchecked(p, choice.layout, choice.estimate)
    text = advice_text(next(a for a in advise(p, choice, REGISTRY) if a.kind == "unchecked"))
    assert "no checked layout fits" in text
