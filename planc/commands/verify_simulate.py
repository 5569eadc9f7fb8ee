"""``planc verify FILE --simulate``: the plan's memory per rank at its full world size, simulated in
this one process on fake tensors (:mod:`planc.verify.simulate`; see docs/verify.md)."""

from __future__ import annotations

import sys
from pathlib import Path

from planc.errors import PlanError


def run_simulation(args) -> int:
    from planc import launch
    from planc.codegen import compile_plan
    from planc.commands.verify_io import load_for_verify, print_result
    from planc.verify import results
    from planc.verify.simulate import CannotSimulate, default_ranks, refusal, simulate

    plan_path, registry, plan = load_for_verify(args.file, "planc verify --simulate", "runs in one process")
    compiled = compile_plan(plan, registry, force=True)  # a layout predicted not to fit is worth checking too
    layout = compiled.layout
    reason = refusal(plan, layout, registry)
    if reason:
        raise PlanError(f"cannot simulate {layout.describe()}: {reason}", hint="see docs/verify.md, 'Simulation'")
    ranks = parse_ranks(args.ranks, layout.dims.world_size) if args.ranks else default_ranks(layout)
    run_dir = Path(args.out) if args.out else launch.default_run_dir(plan_path.with_name(plan_path.stem + "-simulate"))
    launch.write_run_dir(run_dir, compiled)
    print(
        f"planc verify --simulate: {layout.describe()} · rank(s) {', '.join(map(str, ranks))} "
        f"of {layout.dims.world_size} · {run_dir}",
        file=sys.stderr,
    )
    try:
        result = simulate(plan, layout, registry, ranks)
    except CannotSimulate as exc:
        raise PlanError(f"the simulation of {layout.describe()} failed: {exc}", hint=exc.hint) from None
    result.update(
        key=results.plan_key(plan, layout),
        plan_source=results.source_of(plan_path),
        cost_model=results.cost_model_fingerprint(results.plugin_cost_sources(plan, layout, registry)),
    )
    print_result(args, result, render, run_dir, results.save(result, run_dir, "simulate"), "simulate.json")
    return 0


def parse_ranks(text: str, world_size: int) -> list[int]:
    """``"0,7"`` -> ``[0, 7]``, each a rank of the world."""
    try:
        ranks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise PlanError(f"--ranks {text!r} is not a list of rank numbers", hint="for example --ranks 0,7") from None
    outside = [r for r in ranks if not 0 <= r < world_size]
    if not ranks or outside:
        raise PlanError(
            f"--ranks {text!r}: the plan's world has ranks 0 to {world_size - 1}",
            hint="give ranks separated by commas, for example --ranks 0," + str(world_size - 1),
        )
    return sorted(set(ranks))


def render(result: dict) -> str:
    from planc.verify.report import Row, format_rows

    rows = [Row(**{k: v for k, v in r.items() if k != "error"}) for r in result["rows"]]
    seconds = sum(r["seconds"] for r in result["ranks"])
    rss = max(r["max_rss_bytes"] for r in result["ranks"]) / 2**30
    head = [
        f"verify --simulate  {result['describe']} · {result['world_size']} ranks on fake tensors "
        f"({seconds:.0f} s, max RSS {rss:.1f} GiB)",
        "  error = predicted / simulated - 1; the predicted peak is net of the CUDA context and allocator margin",
    ]
    return "\n".join(head) + "\n\n" + format_rows(rows)
