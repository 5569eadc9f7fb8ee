"""planc's predictions against published training runs (tests/data/published_runs.json).

    python bench/accuracy.py                 # every family: summary, then every run
    python bench/accuracy.py --summary       # the per-family table only
    python bench/accuracy.py --family torchtitan-h100 --family llm-foundry-h100
    python bench/accuracy.py --write-stats   # also rewrite planc/cost/accuracy.json and docs/accuracy.md's tables
    python bench/accuracy.py --cpu [ARGS]    # the CPU equivalence matrix, measured here (bench/cpu_accuracy.py ARGS)

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
import re
import statistics
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

from planc.cost import PROFILES
from planc.cost.flops import model_flops_per_step, narayanan_eq3
from planc.planner import NoLegalLayout, choose
from planc.planner.checked import sharded_regime
from planc.spec import build_plan
from planc.strategies.registry import Registry, load_registry
from planc.units import Quantity

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "published_runs.json"
STATS = ROOT / "planc" / "cost" / "accuracy.json"  # read by planc.cost.uncertainty
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


def plans_for(run: dict, hardware_profile: str | None = None):
    """One plan per combination of list-valued layout keys (usually one); ``hardware_profile``
    (an absolute path written by ``planc calibrate``) prices them at its measured rates."""
    layout = dict(run["layout"])
    listed = {k: v for k, v in layout.items() if isinstance(v, list)}
    for combo in itertools.product(*listed.values()):
        lay = {**layout, **dict(zip(listed, combo))}
        train = {"precision": "bf16", **run["train"]}
        # headroom 0: these runs ran, so their layouts fit the device as it is; the planner's safety
        # margin is not part of the question "how fast is this layout".
        hardware = {"headroom": 0, **{k: _quantity(v) for k, v in run["hardware"].items()}}
        if hardware_profile is not None:
            hardware["profile"] = hardware_profile
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


def predict(run: dict, family: dict, registry: Registry, hardware_profile: str | None = None) -> dict:
    """Predicted step, memory and error of one run (strategies from ``registry``)."""
    profile, dropped = profile_for(family, run)
    best = None
    for plan in plans_for(run, hardware_profile):
        try:
            choice = choose(plan, registry, tolerance=0.0, top_k=0, profile=profile)
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
        "metric": _metric_name(run["reported"]),
        "reported": _metric_value(run["reported"]),
        "predicted": _metric_value(run["reported"])
        * (est.step_s / step if "step_s" in run["reported"] else step / est.step_s),
        "reported_step_s": step,
        "predicted_step_s": est.step_s,
        "error": step / est.step_s - 1.0,
        "fits": choice.fits,
        "layout": _layout_text(choice.layout),
        "predicted_memory_gib": est.memory_bytes / GIB,
    }
    regime = sharded_regime(choice.layout, est)
    if regime is not None:
        out["shard_ranks"], out["dp_traffic_ratio"] = regime[0], round(regime[1], 4)
    if "memory_gib" in run["reported"]:
        out["reported_memory_gib"] = run["reported"]["memory_gib"]
        out["memory_error"] = est.memory_bytes / GIB / run["reported"]["memory_gib"] - 1.0
    if dropped:
        out["note"] = "profile options unknown to this planc, ignored: " + ", ".join(dropped)
    return out


def _metric_name(reported: dict) -> str:
    if "step_s" in reported:
        return "s/step"
    if "tokens_per_s_per_gpu" in reported:
        return "tok/s/GPU"
    return {"narayanan_eq3": "TFLOP/s/GPU (Eq. 3)", "model": "model TFLOP/s/GPU"}[reported["flops"]]


def _metric_value(reported: dict) -> float:
    for key in ("step_s", "tokens_per_s_per_gpu", "tflops_per_gpu"):
        if key in reported:
            return float(reported[key])
    raise KeyError("a run reports step_s, tokens_per_s_per_gpu or tflops_per_gpu")


def _layout_text(lay) -> str:
    text = f"t{lay.tp} p{lay.pp} d{lay.dp} z{lay.zero} {lay.recompute} mb{lay.micro_batch}"
    if lay.pp > 1:
        text += f" {lay.schedule}" + (f" v{lay.virtual_stages}" if lay.virtual_stages > 1 else "")
    return text + (" sp" if lay.sequence_parallel else "")


def family_stats(results: list[dict], families: dict, runs: list[dict]) -> dict:
    """Per-family error statistics (the fields documented in docs/accuracy.md)."""
    runs_of: dict[str, list[dict]] = {}
    for r in runs:
        runs_of.setdefault(r["family"], []).append(r)
    stats = {}
    for name, fam in families.items():
        errs = [r["error"] for r in results if r.get("family") == name and r["error"] is not None]
        if not errs:
            continue
        absolute = sorted(abs(e) for e in errs)
        mem = [r["memory_error"] for r in results if r.get("family") == name and "memory_error" in r]
        devices = sorted({_device_text(r["hardware"]) for r in runs_of.get(name, ())})
        stats[name] = {
            "split": fam["split"],
            "in_goal": fam.get("in_goal", True),
            "profile": fam["profile"],
            "devices": devices,
            "runs": len(errs),
            "median_abs_error": round(statistics.median(absolute), 4),
            "mean_error": round(statistics.fmean(errs), 4),
            "p90_abs_error": round(absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))], 4),
            "max_abs_error": round(absolute[-1], 4),
        }
        if mem:
            stats[name]["memory_median_error"] = round(statistics.median(mem), 4)
    return stats


def _device_text(hardware: dict) -> str:
    """The device preset, and which of its figures the run overrides."""
    overridden = sorted(set(hardware) - {"device", "nodes", "per_node"})
    return hardware["device"] + (f" ({', '.join(overridden)} set)" if overridden else "")


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


#: What pyproject.toml registers; without them (planc on the path, not installed) every prediction
#: would silently lose the strategies' cost passes.
BUILTIN_STRATEGIES = frozenset({"ddp", "zero1", "fsdp", "tensor_parallel", "pipeline", "recompute", "bf16"})

#: A published run counts as a check of sharded data parallelism when predicted within this.
CHECKED_WITHIN = 0.15


def sharded_dp(results: list[dict], stats: dict) -> dict:
    """Where sharded data parallelism has been checked (planc.planner.checked): the held-out runs
    in the goal predicted within :data:`CHECKED_WITHIN` that no other such run exceeds in both
    shard ranks and data-parallel traffic / compute; and the sharded runs outside the goal."""

    def point(r: dict) -> dict:
        return {
            "run": r["id"],
            "shard_ranks": r["shard_ranks"],
            "traffic_ratio": r["dp_traffic_ratio"],
            "error": round(r["error"], 4),
        }

    sharded = [r for r in results if "shard_ranks" in r and r.get("error") is not None]
    in_goal = [r for r in sharded if stats[r["family"]]["split"] == "test" and stats[r["family"]]["in_goal"]]
    checked = [r for r in in_goal if abs(r["error"]) <= CHECKED_WITHIN]

    def key(r: dict) -> tuple[int, float]:
        return r["shard_ranks"], r["dp_traffic_ratio"]

    def exceeded(r: dict) -> bool:
        return any(key(o) != key(r) and key(o)[0] >= key(r)[0] and key(o)[1] >= key(r)[1] for o in checked)

    unique = {key(r): r for r in sorted(checked, key=lambda r: r["id"], reverse=True)}  # first id per point
    frontier = sorted((r for r in unique.values() if not exceeded(r)), key=key)
    beyond = [r for r in sharded if not stats[r["family"]]["in_goal"]]
    return {
        "within": CHECKED_WITHIN,
        "frontier": [point(r) for r in frontier],
        "beyond": [point(r) for r in beyond],
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


DOC = ROOT / "docs" / "accuracy.md"
#: Families whose per-run table is folded into a <details> block in the docs (many rows).
FOLDED = ("llm-foundry-h100", "llm-foundry-a100-80gb", "llm-foundry-a100-40gb")


def markdown_families(stats: dict, families: dict) -> str:
    lines = [
        "| family | split | profile | devices | runs | median abs. err. | mean err. | p90 abs. err. | max abs. err. |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for split in ("tune", "test"):
        for name, st in stats.items():
            if st["split"] != split:
                continue
            goal = "" if st["in_goal"] else " (not in goal)"
            lines.append(
                f"| {name}{goal} | {split} | {st['profile']} | {', '.join(st['devices'])} | {st['runs']} | "
                f"{st['median_abs_error']:.1%} | {st['mean_error']:+.1%} | {st['p90_abs_error']:.1%} | "
                f"{st['max_abs_error']:.1%} |"
            )
    return "\n".join(lines) + "\n"


def markdown_runs(results: list[dict], family: str) -> str:
    lines = [
        "| run | planc layout | reported | predicted | error | memory GiB reported / predicted |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.get("family") != family or r["error"] is None:
            continue
        fmt = "{:,.3f}" if r["metric"] == "s/step" else "{:,.0f}" if r["reported"] >= 1000 else "{:,.1f}"
        mem = f"{r['reported_memory_gib']:.1f} / {r['predicted_memory_gib']:.1f}" if "reported_memory_gib" in r else ""
        fit = "" if r["fits"] else " (predicted not to fit)"
        lines.append(
            f"| {r['id'].split('/', 1)[1]} | {r['layout']}{fit} | {fmt.format(r['reported'])} {r['metric']} | "
            f"{fmt.format(r['predicted'])} | {r['error']:+.1%} | {mem} |"
        )
    return "\n".join(lines) + "\n"


def markdown_blocks(results: list[dict], stats: dict, families: dict) -> dict[str, str]:
    """Generated blocks of docs/accuracy.md, by marker name."""
    blocks = {"families": markdown_families(stats, families)}
    for name in families:
        table = markdown_runs(results, name)
        if name in FOLDED:
            table = f"<details><summary>{stats[name]['runs']} runs</summary>\n\n{table}\n</details>\n"
        blocks[f"runs:{name}"] = table
    return blocks


MARKER = re.compile(r"(<!-- accuracy:(\S+) -->\n)(.*?)(<!-- /accuracy -->)", re.S)


def refreshed_doc(text: str, blocks: dict[str, str]) -> str:
    return MARKER.sub(lambda m: m.group(1) + blocks[m.group(2)] + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--cpu"]:  # predicted vs measured on this machine, before and after calibration
        sys.path.insert(0, str(ROOT / "bench"))
        import cpu_accuracy

        return cpu_accuracy.main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", help="only this family (repeatable)")
    parser.add_argument("--summary", action="store_true", help="print the per-family table only")
    parser.add_argument("--json", metavar="PATH", help="write every run's result and the statistics as JSON")
    parser.add_argument(
        "--write-stats",
        action="store_true",
        help=f"rewrite {STATS.relative_to(ROOT)} and the generated tables of {DOC.relative_to(ROOT)}",
    )
    args = parser.parse_args(argv)

    data = load()
    families = data["families"]
    unknown = set(args.family or ()) - set(families)
    if unknown:
        print(f"unknown family: {', '.join(sorted(unknown))}; known: {', '.join(families)}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    runs = [r for r in data["runs"] if not args.family or r["family"] in args.family]
    registry = load_registry()
    missing = BUILTIN_STRATEGIES - registry.registered
    if missing:  # planc importable from the source tree but not installed: no entry points, no strategies
        print(
            f"planc's built-in strategies are not registered in this Python ({', '.join(sorted(missing))}): "
            "install planc into it (pip install -e .) before predicting",
            file=sys.stderr,
        )
        return 2
    results = [predict(r, families[r["family"]], registry) for r in runs]
    stats = family_stats(results, families, runs)
    print_summary(stats)
    print(f"\nband for the planner: {band(stats)}")
    print(f"sharded data parallelism checked up to: {sharded_dp(results, stats)['frontier']}")
    if not args.summary:
        print_runs(results)
    print(f"\n{len(results)} runs in {time.perf_counter() - start:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"stats": stats, "runs": results}, indent=1))
    if args.write_stats:
        if args.family:
            print("--write-stats needs every family (drop --family)", file=sys.stderr)
            return 2
        write_stats(stats, sharded_dp(results, stats))
        DOC.write_text(refreshed_doc(DOC.read_text(encoding="utf-8"), markdown_blocks(results, stats, families)))
        print(f"refreshed {DOC.relative_to(ROOT)}")
    return 0


def write_stats(stats: dict, sharded: dict) -> None:
    doc = {
        "about": "Cost-model step-time error against published runs, per family; written by "
        "bench/accuracy.py --write-stats from tests/data/published_runs.json. Fields: docs/accuracy.md.",
        "error_definition": "predicted throughput / reported throughput - 1",
        "band": band(stats),
        "families": stats,
        "sharded_dp": sharded,
    }
    STATS.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {STATS.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
