"""How a family's error moves with a device peak its source does not pin down.

    python bench/peak_sensitivity.py                      # torchtitan's H100 families at 835 / 912 / 989
    python bench/peak_sensitivity.py --family F --peak "800 TFLOPS" ...

torchtitan measured on 96 GB HBM2e H100s at a 500 W limit whose "actual peak TFLOPs number is
between SXM and NVL, and we don't know its exact value" (benchmarks/llama3_h100_202412_torchtitan.md,
footnote 2): 835 to 989 TFLOP/s dense bf16. tests/data/published_runs.json prices them at the
midpoint, 912; this prints each family's median |error| and per-run errors at the ends of that
range and at the midpoint, so that the part of the miss the unknown peak can hold is a number. It
changes no run's description and tunes nothing (docs/accuracy.md, "Remaining errors").
"""

from __future__ import annotations

import argparse
import statistics

import accuracy

from planc.strategies.registry import load_registry

FAMILIES = ("torchtitan-h100", "torchtitan-h100-compile")
PEAKS = ("835 TFLOPS", "912 TFLOPS", "989 TFLOPS")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", action="append", help="a family (repeatable; default: torchtitan's H100 ones)")
    parser.add_argument("--peak", action="append", help='a peak as a .plan writes it, e.g. "835 TFLOPS" (repeatable)')
    args = parser.parse_args(argv)
    data, registry = accuracy.load(), load_registry()
    print("| family | peak | median abs. error | errors per run |")
    print("|---|---|---:|---|")
    for family in args.family or FAMILIES:
        for peak in args.peak or PEAKS:
            errors = [
                accuracy.predict(
                    {**run, "hardware": {**run["hardware"], "peak": peak}}, data["families"][family], registry
                )["error"]
                for run in data["runs"]
                if run["family"] == family
            ]
            median = statistics.median(abs(e) for e in errors)
            listed = ", ".join(f"{e:+.1%}" for e in errors)
            print(f"| {family} | {peak} | {median:.1%} | {listed} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
