"""Host time per step of the synthetic data: one rank's rows against the whole global batch.

    python bench/data_rows.py            # a table: the published shapes below, median of 5 steps each

Every rank trains on its data-parallel share of a step's global batch. planc builds only that
share (``rows_for_step``: each synthetic row walks from its own random stream); until 2026-11-27 it
built the whole batch on every rank and kept its rows. This prints, side by side in one run, the
seconds per step of both on this host, for batches that published runs used, at their DP degree:

* Llama 3 405B (Llama Team 2024, Table 4): 16 M tokens per step (2,048 x 8,192), DP 64 (TP 8 x PP 16
  on 8,192 GPUs);
* GPT-3 175B on 1,024 A100s (Narayanan et al. 2021, Table 1): 1,536 x 2,048 tokens, DP 16;
* planc's one-H100 plan (plans/gpu/): 4 x 8,192, DP 1 (the rank's rows are the batch).

The time is the host's, inside the step: a GPU has nothing queued while it runs.
"""

from __future__ import annotations

import functools
import statistics
import time

from planc.runtime.data import SyntheticData
from planc.runtime.rows import rank_rows

#: (name, vocabulary, seq_len, global batch, dp)
SHAPES = [
    ("llama3-405b, 16 M tokens, DP 64", 128_256, 8_192, 2_048, 64),
    ("gpt3-175b, 3.1 M tokens, DP 16", 51_200, 2_048, 1_536, 16),
    ("one H100, 32 k tokens, DP 1", 128_256, 8_192, 4, 1),
]
STEPS = 5


def seconds(fn) -> float:
    times = []
    for step in range(STEPS):
        began = time.perf_counter()
        fn(step)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    print("| batch | whole batch per rank | the rank's rows | ratio |")
    print("|---|---:|---:|---:|")
    for name, vocab, seq_len, global_batch, dp in SHAPES:
        data = SyntheticData(vocab, seq_len, global_batch, seed=0)
        start, stop = rank_rows(global_batch, dp - 1, dp, 1)  # the last rank: no rank is favoured
        whole = seconds(data.batch_for_step)
        rows = seconds(functools.partial(data.rows_for_step, start=start, stop=stop))
        print(f"| {name} | {whole * 1e3:.1f} ms | {rows * 1e3:.1f} ms | {whole / rows:.1f}x |")


if __name__ == "__main__":
    main()
