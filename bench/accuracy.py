"""planc's predictions against published training runs (tests/data/published_runs.json).

    python bench/accuracy.py                 # every family: summary, then every run
    python bench/accuracy.py --summary       # the per-family table only
    python bench/accuracy.py --family torchtitan-h100 --family llm-foundry-h100
    python bench/accuracy.py --write-stats   # also rewrite planc/cost/accuracy.json

For every run the published layout is fixed in a plan (hardware, batch, micro-batch, TP/PP/DP,
ZeRO stage, recomputation, schedule); keys the source does not give are searched with tolerance
0 (the fastest layout, as the authors tuned theirs), and a list of values means the best of
them. The program is described by the family's runtime profile (``planc`` = the program planc
emits; ``megatron-lm-2021``, ``megatron-core-2024``) with the family's and the run's
``profile_options``. What was reported is turned into a step time with the run's own FLOP
convention, and the error is

    predicted throughput / reported throughput - 1  (= reported step / predicted step - 1)

so +10% means planc predicts a run 10% faster than it was. Where a run reports peak memory,
predicted peak memory is shown beside it. Families are split into ``tune`` (what the cost model
was built on) and ``test`` (held out); see the data file's ``split_policy``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

from planc.cost import PROFILES
from planc.cost.flops import model_flops_per_step, narayanan_eq3
from planc.planner import NoLegalLayout, choose
from planc.spec import build_plan
from planc.units import Quantity

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "published_runs.json"
STATS = ROOT / "planc" / "cost" / "accuracy.json"
GIB = 2**30


def load() -> dict:
    return json.loads(DATA.read_text())


def profile_for(family: dict, run: dict):
    """The family's runtime profile with the family's and the run's options applied; options this
    planc does not know are dropped (and listed) so the bench runs on older code too."""
    base = PROFILES[family["profile"]]
    options = {**family.get("profile_options", {}), **run.get("profile_options", {})}
    known = {f.name for f in fields(base)}
    dropped = sorted(k for k in options if k not in known)
    kept = {k: v for k, v in options.items() if k in known}
    return (replace(base, **kept) if kept else base), dropped


def plans_for(run: dict):
    """One plan per combination of list-valued layout keys (usually one)."""
    layout = dict(run["layout"])
    listed = {k: v for k, v in layout.items() if isinstance(v, list)}
    for combo in itertools.product(*listed.values()):
        lay = {**layout, **dict(zip(listed, combo))}
        train = {"precision": "bf16", **run["train"]}
        hardware = {k: _quantity(v) for k, v in run["hardware"].items()}
        yield build_plan({"model": run["model"], "hardware": hardware, "train": train, "layout": lay})


def _quantity(value):
    """'95 GiB' -> Quantity, as the .plan reader would make it; other values unchanged."""
    if isinstance(value, str) and " " in value:
        number, unit = value.split()
        return Quantity.of(float(number), unit)
    return value


def reported_step(run: dict, plan) -> float:
    """The reported step time, from whatever metric the run gives (see the data's conventions)."""
    rep = run["reported"]
    if "step_s" in rep:
        return rep["step_s"]
    gpus = plan.world_size
    tokens = plan.tokens_per_step
    if "tokens_per_s_per_gpu" in rep:
        return tokens / (rep["tokens_per_s_per_gpu"] * gpus)
    m = plan.model
    if rep["flops"] == "narayanan_eq3":
        flops = narayanan_eq3(plan.train.global_batch, m.seq_len, m.layers, m.hidden, m.vocab)
    else:
        flops = model_flops_per_step(m, tokens)
    return flops / (rep["tflops_per_gpu"] * 1e12 * gpus)


def predict(run: dict, family: dict) -> dict:
    """Predicted step, memory and error of one run."""
    profile, dropped = profile_for(family, run)
    best = None
    for plan in plans_for(run):
        try:
            choice = choose(plan, tolerance=0.0, top_k=0, profile=profile)
        except NoLegalLayout as exc:
            return {"id": run["id"], "error": None, "note": f"no legal layout: {exc}"}
        if best is None or (choice.fits, -choice.estimate.step_s) > (best[1].fits, -best[1].estimate.step_s):
            best = (plan, choice)
    plan, choice = best
    est = choice.estimate
    step = reported_step(run, plan)
    out = {
        "id": run["id"],
        "family": run["family"],
        "split": run["split"],
        "reported_step_s": step,
        "predicted_step_s": est.step_s,
        "error": step / est.step_s - 1.0,
        "fits": choice.fits,
        "layout": _layout_text(choice.layout),
        "predicted_memory_gib": est.memory_bytes / GIB,
    }
    if "memory_gib" in run["reported"]:
        out["reported_memory_gib"] = run["reported"]["memory_gib"]
        out["memory_error"] = est.memory_bytes / GIB / run["reported"]["memory_gib"] - 1.0
    if dropped:
        out["note"] = "profile options unknown to this planc, ignored: " + ", ".join(dropped)
    return out


def _layout_text(lay) -> str:
    text = f"t{lay.tp} p{lay.pp} d{lay.dp} z{lay.zero} {lay.recompute} mb{lay.micro_batch}"
    if lay.pp > 1:
        text += f" {lay.schedule}" + (f" v{lay.virtual_stages}" if lay.virtual_stages > 1 else "")
    return text + (" sp" if lay.sequence_parallel else "")


def family_stats(results: list[dict], families: dict) -> dict:
    """Per-family error statistics (the fields documented in docs/accuracy.md)."""
    stats = {}
    for name, fam in families.items():
        errs = [r["error"] for r in results if r.get("family") == name and r["error"] is not None]
        if not errs:
            continue
        absolute = sorted(abs(e) for e in errs)
        mem = [r["memory_error"] for r in results if r.get("family") == name and "memory_error" in r]
        stats[name] = {
            "split": fam["split"],
            "in_goal": fam.get("in_goal", True),
            "runs": len(errs),
            "median_abs_error": round(statistics.median(absolute), 4),
            "mean_error": round(statistics.fmean(errs), 4),
            "p90_abs_error": round(absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))], 4),
            "max_abs_error": round(absolute[-1], 4),
        }
        if mem:
            stats[name]["memory_median_error"] = round(statistics.median(mem), 4)
    return stats


def band(stats: dict) -> dict:
    """The uncertainty band the planner can use: over the held-out families in the goal, the
    median of their median |errors| and the largest family median."""
    held = [s["median_abs_error"] for s in stats.values() if s["split"] == "test" and s["in_goal"]]
    tune = [s["median_abs_error"] for s in stats.values() if s["split"] == "tune"]
    return {
        "step_time_relative": round(statistics.median(held), 4) if held else None,
        "step_time_relative_worst_family": round(max(held), 4) if held else None,
        "tune_median_abs_error": round(statistics.median(tune), 4) if tune else None,
    }


def print_summary(stats: dict) -> None:
    print(f"{'family':<28}{'split':>6}{'runs':>6}{'median|err|':>13}{'mean err':>10}{'p90|err|':>10}{'max|err|':>10}")
    for split in ("tune", "test"):
        for name, s in stats.items():
            if s["split"] != split:
                continue
            flag = "" if s["in_goal"] else "  (not in goal)"
            print(
                f"{name:<28}{split:>6}{s['runs']:>6}{s['median_abs_error']:>13.1%}{s['mean_error']:>+10.1%}"
                f"{s['p90_abs_error']:>10.1%}{s['max_abs_error']:>10.1%}{flag}"
            )


def print_runs(results: list[dict]) -> None:
    print(f"\n{'run':<52}{'reported s':>11}{'predicted s':>12}{'error':>8}  {'memory GiB rep/pred':<20} layout")
    for r in results:
        if r["error"] is None:
            print(f"{r['id']:<52}  {r['note']}")
            continue
        mem = ""
        if "reported_memory_gib" in r:
            mem = f"{r['reported_memory_gib']:.1f}/{r['predicted_memory_gib']:.1f}"
        fit = "" if r["fits"] else " (predicted not to fit)"
        print(
            f"{r['id']:<52}{r['reported_step_s']:>11.3f}{r['predicted_step_s']:>12.3f}{r['error']:>+8.1%}  "
            f"{mem:<20} {r['layout']}{fit}"
        )
        if r.get("note"):
            print(f"{'':<52}  {r['note']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", help="only this family (repeatable)")
    parser.add_argument("--summary", action="store_true", help="print the per-family table only")
    parser.add_argument("--json", metavar="PATH", help="write every run's result and the statistics as JSON")
    parser.add_argument("--write-stats", action="store_true", help=f"rewrite {STATS.relative_to(ROOT)}")
    args = parser.parse_args(argv)

    data = load()
    families = data["families"]
    unknown = set(args.family or ()) - set(families)
    if unknown:
        print(f"unknown family: {', '.join(sorted(unknown))}; known: {', '.join(families)}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    runs = [r for r in data["runs"] if not args.family or r["family"] in args.family]
    results = [predict(r, families[r["family"]]) for r in runs]
    stats = family_stats(results, families)
    print_summary(stats)
    print(f"\nband for the planner: {band(stats)}")
    if not args.summary:
        print_runs(results)
    print(f"\n{len(results)} runs in {time.perf_counter() - start:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"stats": stats, "runs": results}, indent=1))
    if args.write_stats:
        if args.family:
            print("--write-stats needs every family (drop --family)", file=sys.stderr)
            return 2
        write_stats(stats)
    return 0


def write_stats(stats: dict) -> None:
    doc = {
        "about": "Cost-model step-time error against published runs, per family; written by "
        "bench/accuracy.py --write-stats from tests/data/published_runs.json. Fields: docs/accuracy.md.",
        "error_definition": "predicted throughput / reported throughput - 1",
        "band": band(stats),
        "families": stats,
    }
    STATS.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {STATS.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
