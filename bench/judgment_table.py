"""The judgment scenarios (tests/planner/judgment_scenarios.py) and the example plans: what the
planner chooses for each, whether an expert would accept it, and how full the memory is.

    python bench/judgment_table.py            # a markdown table
    python bench/judgment_table.py --json     # one object per scenario (for before/after diffs)

Run it on two commits and compare the outputs: that is the before/after table of issue 12.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "planner"))

from judgment_scenarios import SCENARIOS  # noqa: E402

from planc.planner import choose  # noqa: E402
from planc.spec import build_plan  # noqa: E402
from planc.strategies.registry import load_registry  # noqa: E402

GiB = 2**30


def rows() -> list[dict]:
    registry = load_registry()
    out = []
    for s in SCENARIOS:
        plan = build_plan(s.plan)
        choice = choose(plan, registry)
        ok = s.accept(choice) if s.on_choice else s.accept(choice.layout)
        est = choice.estimate
        out.append(
            {
                "scenario": s.name,
                "expect": s.expect,
                "chosen": choice.layout.describe() + ("" if choice.fits else " (does not fit)"),
                "memory_gib": round(est.memory_bytes / GiB, 2),
                "capacity_gib": round(est.capacity / GiB, 2),
                "accepted": bool(ok),
            }
        )
    return out


def main() -> None:
    table = rows()
    if "--json" in sys.argv:
        print(json.dumps(table, indent=1))
        return
    print("| scenario | expert accepts | chosen | memory | ok |")
    print("|---|---|---|---|---|")
    for r in table:
        mem = f"{r['memory_gib']:.1f} / {r['capacity_gib']:.1f} GiB"
        print(f"| {r['scenario']} | {r['expect']} | {r['chosen']} | {mem} | {'yes' if r['accepted'] else 'NO'} |")
    print(f"\naccepted {sum(r['accepted'] for r in table)} of {len(table)}")


if __name__ == "__main__":
    main()
