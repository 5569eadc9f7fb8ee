"""FSDP's single micro-batch per step is not scored where its score could change nothing.

A search tries that micro-batch on its own for each recomputation whose smaller micro-batch did
not fit (:func:`planc.planner.explore._score_alone`), from the most recomputation down: once one
misses and its rung already has a miss needing no more, those with less recomputation (needing
more memory) are skipped. The search must report exactly what it reported without the skip:
every fitting layout with its numbers, each rung's closest miss and bound, the refusals and the
dominated rungs -- only fewer layouts scored.
"""

import json
from pathlib import Path

import pytest
from judgment_scenarios import SCENARIOS

from planc.dsl.load import load_plan
from planc.planner import explore
from planc.spec import build_plan
from planc.strategies.registry import load_registry

PLANS = Path(__file__).resolve().parents[2] / "plans"


def plan_named(name: str, registry):
    """An example plan file, or a judgment scenario's plan (torchtitan's Llama 2 13B on 64 A100s: there a member
    with less recomputation fits where one with more does; skipping it changes the result)."""
    if name.endswith(".plan"):
        return load_plan(PLANS / name, strategies=registry)
    return build_plan(next(s.plan for s in SCENARIOS if s.name == name))


def report(result: explore.SearchResult) -> dict[str, str]:
    """Everything a search hands to the chooser and to explain, part by part, as comparable text."""

    def misses(by_rung: dict) -> dict:
        return {int(r): (c.layout.describe(), c.estimate.memory_bytes) for r, c in by_rung.items()}

    fitting = sorted((c.layout.describe(), c.estimate.memory_bytes, c.estimate.step_s) for c in result.fitting)
    refused = {int(r): reason for r, reason in result.refused.items()}
    parts = {
        "fitting layouts": fitting,
        "closest misses": misses(result.tightest_misfit),
        "family bounds": misses(result.family_bound),
        "dominated rungs": sorted(map(int, result.dominated)),
        "refusals": refused,
    }
    return {name: json.dumps(part, sort_keys=True) for name, part in parts.items()}


@pytest.mark.parametrize("name", ["llama3-70b-64xh100.plan", "run:torchtitan-a100/llama2-13b-sac-op"])
def test_skipping_single_micro_batch_members_changes_no_result(name, monkeypatch):
    registry = load_registry()
    plan = plan_named(name, registry)
    skipped = []
    cannot_matter = explore._cannot_matter

    def counted(result, floor, layout):
        skipped.append(cannot_matter(result, floor, layout))
        return skipped[-1]

    monkeypatch.setattr(explore, "_cannot_matter", counted)
    pruned = explore.search(plan, registry)
    monkeypatch.setattr(explore, "_cannot_matter", lambda result, floor, layout: False)
    whole = explore.search(plan, registry)

    assert any(skipped), f"{name}: nothing was skipped, so this checks nothing"
    assert pruned.scored < whole.scored
    ours, theirs = report(pruned), report(whole)
    # Compared part by part, named: a failing diff of the whole texts takes pytest minutes.
    differing = [part for part in ours if ours[part] != theirs[part]]
    assert not differing, f"{name}: the search without the skip reports other {', '.join(differing)}"
