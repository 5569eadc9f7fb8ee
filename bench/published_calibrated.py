"""Published runs priced with a calibration of the same kind of GPU, beside the data-sheet prediction.

    python bench/published_calibrated.py workload --device H100-SXM --out workload.json
    python -m planc.calibrate.worker --workload workload.json --out h100.json     # on one such GPU
    python bench/published_calibrated.py compare h100.json --device H100-SXM

``workload`` writes what ``planc calibrate``'s worker measures (its ``--workload`` file): every GEMM
and attention shape the cost model prices for the published runs on ``--device``, at the layout it
picks for each (the published one where the source gives it), so that the profile holds each run's
exact shapes. ``compare`` prices those runs twice -- with the device preset's data-sheet rates and
with the profile's measured GEMM, memory-bandwidth and dispatch rates (links stay the preset's: one
GPU measures no NVLink or network; attention stays each family's own kernel, since the published
programs did not run this torch's SDPA, unless ``--with-attention``) -- and prints both errors per
run and per family,
tuning and held-out families apart (bench/accuracy.py's conventions: error = reported step /
predicted step - 1, + means planc predicts the run faster than it was).

A profile of one GPU measures it alone, cool and with its neighbours idle, in this machine's
PyTorch and cuBLAS: the comparison says how much of a family's error the compute rates explain,
not that the rest is the network's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import accuracy  # noqa: E402

from planc.cost.compute import block_gemms  # noqa: E402
from planc.planner import choose  # noqa: E402
from planc.strategies.registry import load_registry  # noqa: E402


def runs_on(device: str, families: list[str] | None) -> tuple[dict, list[dict]]:
    data = accuracy.load()
    runs = [r for r in data["runs"] if r["hardware"]["device"] == device and (not families or r["family"] in families)]
    return data["families"], runs


def variant(run: dict) -> bool:
    """The run's GPU differs from the preset (another memory, bandwidth or peak: e.g. torchtitan's
    96 GB H100s): the calibrated GPU is not quite its GPU, so its row is marked."""
    return bool(set(run["hardware"]) - {"device", "nodes", "per_node"})


def write_workload(device: str, families: list[str] | None, out: Path) -> int:
    family_of, runs = runs_on(device, families)
    registry = load_registry()
    gemms: set[tuple[int, int, int]] = set()
    attention: set[tuple[int, int, int, int]] = set()
    dtypes: set[str] = set()
    for run in runs:
        profile, _ = accuracy.profile_for(family_of[run["family"]], run)
        for plan in accuracy.plans_for(run):
            layout = choose(plan, registry, tolerance=0.0, top_k=0, profile=profile).layout
            model, tokens = plan.model, plan.model.seq_len * layout.micro_batch
            gemms.update(block_gemms(model, tokens, layout.tp))
            gemms.add((tokens, model.hidden, model.padded_vocab // layout.tp))
            attention.add((layout.micro_batch, max(1, model.heads // layout.tp), model.seq_len, model.head_dim))
            dtypes.add(plan.train.precision)
    workload = {
        "gemms": sorted(gemms),
        "attention": sorted(attention),
        "dtypes": sorted(dtypes),
        "message_bytes": [],  # one GPU: no collectives
    }
    out.write_text(json.dumps(workload) + "\n")
    print(f"{out}: {len(gemms)} GEMM and {len(attention)} attention shapes from {len(runs)} {device} runs")
    return 0


def pricing_profile(profile_path: Path, scratch: Path, with_attention: bool) -> str:
    """The profile to price published runs with: ``profile_path`` itself, or by default a copy in
    ``scratch`` without its attention rates (the published programs ran their own attention
    kernels, not this torch's SDPA)."""
    if with_attention:
        return str(profile_path.resolve())
    data = json.loads(profile_path.read_text())
    data["measured"]["attention"] = []
    copy = scratch / "profile-without-attention.json"
    copy.write_text(json.dumps(data))
    return str(copy)


def compare(profile_path: Path, device: str, families: list[str] | None, with_attention: bool = False) -> int:
    with tempfile.TemporaryDirectory() as scratch:
        return _compare(pricing_profile(profile_path, Path(scratch), with_attention), device, families)


def _compare(profile: str, device: str, families: list[str] | None) -> int:
    family_of, runs = runs_on(device, families)
    registry = load_registry()
    rows = []
    for run in runs:
        sheet = accuracy.predict(run, family_of[run["family"]], registry)
        measured = accuracy.predict(run, family_of[run["family"]], registry, hardware_profile=profile)
        if sheet["error"] is None or measured["error"] is None:
            continue
        rows.append((run, sheet, measured))
    print(f"{'run':58} {'layout':28} {'sheet':>7} {'calib':>7}")
    for run, sheet, measured in rows:
        mark = "*" if variant(run) else " "
        print(
            f"{run['id'][:57]:57}{mark} {measured['layout'][:28]:28} {sheet['error']:+7.1%} {measured['error']:+7.1%}"
        )
    if any(variant(run) for run, _, _ in rows):
        print("* the run's GPU is a variant of the preset (its plan sets memory, hbm_bw or peak)")
    print(f"\n{'family':26} {'split':6} {'runs':>4}  median |error|: sheet  calibrated   mean error: sheet  calibrated")
    for name in sorted({run["family"] for run, _, _ in rows}):
        mine = [(s["error"], m["error"]) for run, s, m in rows if run["family"] == name]
        sheet_errors, calibrated = [e for e, _ in mine], [e for _, e in mine]
        print(
            f"{name:26} {family_of[name]['split']:6} {len(mine):4}  "
            f"{statistics.median(map(abs, sheet_errors)):21.1%} {statistics.median(map(abs, calibrated)):11.1%}"
            f"   {statistics.fmean(sheet_errors):+17.1%} {statistics.fmean(calibrated):+11.1%}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    work = sub.add_parser("workload", help="the shapes to calibrate for the published runs on a device")
    work.add_argument("--device", default="H100-SXM")
    work.add_argument("--family", action="append")
    work.add_argument("--out", type=Path, required=True)
    comp = sub.add_parser("compare", help="published runs priced with the data sheet and with a profile")
    comp.add_argument("profile", type=Path)
    comp.add_argument("--device", default="H100-SXM")
    comp.add_argument("--family", action="append")
    comp.add_argument(
        "--with-attention",
        action="store_true",
        help="also price attention at the profile's SDPA rates (default: each family's own kernel, from the table)",
    )
    args = parser.parse_args(argv)
    if args.command == "workload":
        return write_workload(args.device, args.family, args.out)
    return compare(args.profile, args.device, args.family, args.with_attention)


if __name__ == "__main__":
    raise SystemExit(main())
