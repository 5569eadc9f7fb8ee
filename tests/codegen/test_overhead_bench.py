"""``bench/overhead.py`` measures the emitted program through ``bench/step_stamps.py``.

The emitted program ends with ``planc.runtime.loop.leave`` (``os._exit``), which runs no
``finally``: for a day the stamps were never written and the benchmark stopped with
FileNotFoundError on its first launch, unnoticed. This launch of one process keeps the
benchmark's measuring path working.
"""

import pytest
from bench_scripts import load_bench


@pytest.mark.dist
def test_the_benchmark_stamps_every_step_of_the_emitted_program(tmp_path):
    bench = load_bench("overhead")
    steps = bench.WARMUP + 3
    plan_path = tmp_path / "ddp.plan"
    plan_path.write_text(bench.plan_text("ddp", 1, steps))
    measured = bench.run_planc(plan_path, 1, steps, tmp_path)
    # One stamp per step: steps - 1 gaps between them, the first WARMUP dropped.
    assert len(measured["wall"]) == len(measured["cpu"]) == steps - 1 - bench.WARMUP
    assert all(gap > 0 for gap in measured["wall"])
    # The loop outside train_step: a whole iteration's gap less the step the record logs.
    assert len(measured["loop"]) == len(measured["wall"])
    assert all(loop < gap for loop, gap in zip(measured["loop"], measured["wall"]))
