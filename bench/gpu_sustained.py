"""Does a GPU hold its burst GEMM rate under sustained load? One GEMM shape, back to back, per window.

    python bench/gpu_sustained.py [--seconds 20] [--m 8192 --k 4096 --n 14336]

``planc calibrate`` times each shape for a fraction of a second on an idle GPU, when it runs at its
boost clock; training keeps it busy for hours, at whatever clock its power and temperature allow.
This runs one bf16 GEMM (default: Llama 3 8B's MLP up-projection over 8192 tokens) back to back for
``--seconds``, rotating over several operand sets so the L2 cache holds none of them, and prints
the rate of every one-second window with the SM clock, power draw and temperature ``nvidia-smi``
reports at its end; then the first window's rate over the last's.
"""

from __future__ import annotations

import argparse
import subprocess
import time

import torch


def smi() -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "nvidia-smi unavailable"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--m", type=int, default=8192)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--n", type=int, default=14336)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_sustained: no CUDA device")
        return 1
    operands = [
        (
            torch.randn(args.m, args.k, device="cuda", dtype=torch.bfloat16),
            torch.randn(args.k, args.n, device="cuda", dtype=torch.bfloat16),
        )
        for _ in range(4)
    ]
    flops = 2.0 * args.m * args.k * args.n
    for a, b in operands:  # warm-up: cuBLAS picks its kernel
        torch.matmul(a, b)
    torch.cuda.synchronize()
    print(f"GEMM {args.m} x {args.k} x {args.n} bf16, {args.seconds:.0f} s; before: {smi()}")
    rates = []
    began = time.perf_counter()
    while time.perf_counter() - began < args.seconds:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        calls = 0
        window = time.perf_counter()
        start.record()
        while time.perf_counter() - window < 1.0:
            for a, b in operands:
                torch.matmul(a, b)
            calls += len(operands)
            if calls % 64 == 0:
                torch.cuda.synchronize()  # keep the host within a second of the device
        end.record()
        end.synchronize()
        rate = calls * flops / (start.elapsed_time(end) / 1e3)
        rates.append(rate)
        print(f"  t={time.perf_counter() - began:5.1f} s  {rate / 1e12:6.1f} TFLOP/s   {smi()}")
    print(
        f"RESULT sustained GEMM: first window {rates[0] / 1e12:.0f}, last {rates[-1] / 1e12:.0f} TFLOP/s "
        f"(last / first {rates[-1] / rates[0]:.3f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
