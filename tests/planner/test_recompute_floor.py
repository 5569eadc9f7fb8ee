"""Rule 6: where a family is tight, a scan scores its most recomputation first, and skips the
layouts with less that can neither fit nor be their rung's closest miss
(:class:`planc.planner.explore._Floors`).

Whether the rule runs (:data:`planc.planner.explore.FLOORS_FROM`) may change which layouts are
scored, never what the search reports: every fitting layout with its numbers, each rung's closest
miss and bound, the refusals and the dominated rungs are the same with the rule off, as set, and
run in every family.
"""

import pytest
from test_alone_floor import plan_named, report

from planc.planner import explore
from planc.strategies.registry import load_registry

# Tight plans, where the rule skips most: a 405B model sharded 128 ways, BLOOM 176B on 384 A100s,
# GPT 1T on 3072 A100s.
CASES = ["run:torchtitan-h100/llama3.1-405b-fsdp16-tp8", "bloom-176b-384xa100", "gpt-1t-3072xa100.plan"]


@pytest.mark.parametrize("name", CASES)
def test_the_recompute_floors_change_no_result(name, monkeypatch):
    registry = load_registry()
    plan = plan_named(name, registry)
    skipped = []
    score = explore._Floors.score

    def counted(self, layout, first):
        cand = score(self, layout, first)
        skipped.append(cand is None)
        return cand

    monkeypatch.setattr(explore._Floors, "score", counted)
    as_set = explore.search(plan, registry)
    monkeypatch.setattr(explore, "FLOORS_FROM", float("inf"))
    off = explore.search(plan, registry)
    monkeypatch.setattr(explore, "FLOORS_FROM", 0.0)
    everywhere = explore.search(plan, registry)

    assert any(skipped), f"{name}: no layout was skipped, so this checks nothing"
    assert as_set.scored < off.scored
    for label, other in (("off", off), ("run in every family", everywhere)):
        ours, theirs = report(as_set), report(other)
        differing = [part for part in ours if ours[part] != theirs[part]]
        assert not differing, f"{name}: with the rule {label} the search reports other {', '.join(differing)}"


def test_a_layout_behind_a_missing_floor_is_scored_while_it_can_be_its_rungs_closest_miss():
    """Without tensor or pipeline parallelism recomputation is the rung: the floor (full) misses,
    and a layout with none is skipped only once its own rung has a miss needing no more memory
    than the floor (skipping it sooner would drop that rung's row from explain)."""
    registry = load_registry()
    plan = plan_named("llama3-8b-8xh100.plan", registry)
    family = next(f for f in explore.families(plan) if (f.tp, f.pp, f.zero) == (1, 1, 3))
    scorer = explore.Scorer(plan, registry, explore.ContextCache(plan), explore.SearchResult())

    def scored(recompute: str, gib: float) -> explore.Candidate:
        cand = scorer.score(family.layout(recompute, family.schedules[0], False, family.micro_batches[0]))
        return explore.Candidate(cand.layout, cand.estimate.replace(peak_memory=gib * 2**30), cand.complexity)

    capacity = scorer.score(family.leanest(family.micro_batches[0])).estimate.capacity / 2**30
    floor, layout = scored("full", capacity + 2), scored("none", capacity + 9).layout
    assert not floor.fits and floor.rung != explore.rung_of(layout)
    result = scorer.result
    assert not explore._cannot_matter(result, floor, layout)  # the none rung has no miss yet
    result.note_misfit(scored("none", capacity + 3))
    assert not explore._cannot_matter(result, floor, layout)  # ... only one needing more than the floor
    result.note_misfit(scored("none", capacity + 1))
    assert explore._cannot_matter(result, floor, layout)
    assert not explore._cannot_matter(result, scored("full", capacity - 1), layout)  # a floor that fits
