"""Run a program ``planc compile`` emitted, stamping the end of every step on rank 0 (for bench/overhead.py).

    torchrun ... bench/step_stamps.py OUT.json train.py [train.py's arguments]

It wraps :meth:`planc.runtime.metrics.MetricsLogger.log` -- called once per finished step, where the
loop takes ``elapsed_s`` -- to record ``time.perf_counter()`` (wall) and ``time.process_time()``
(CPU seconds of every thread of the process) when it returns, then runs the program unchanged.
bench/handwritten.py records the same two clocks at the end of its steps, so the gaps between
consecutive stamps are whole loop iterations by one definition in both programs. CPU time is
what this process itself spent, so it is much less disturbed than wall time by other work on a
shared machine (time waiting in a collective is not in it). The program ends with
:func:`planc.runtime.loop.leave` (``os._exit``, which runs no ``finally``), so the stamps are
written by a wrapper of it, and by ``finally`` when the program raises.
"""

import json
import os
import runpy
import sys
import time

import planc.runtime.loop
from planc.runtime.metrics import MetricsLogger


def main() -> None:
    out_path, program, *args = sys.argv[1:]
    stamps: dict[str, list[float]] = {"wall_s": [], "cpu_s": []}
    log = MetricsLogger.log

    def stamped_log(self, *a, **kw):
        record = log(self, *a, **kw)
        stamps["wall_s"].append(time.perf_counter())
        stamps["cpu_s"].append(time.process_time())
        return record

    def write_stamps() -> None:
        if os.environ.get("RANK", "0") == "0":
            with open(out_path, "w") as out:
                json.dump(stamps, out)

    leave = planc.runtime.loop.leave

    def stamped_leave():
        write_stamps()
        leave()

    MetricsLogger.log = stamped_log
    planc.runtime.loop.leave = stamped_leave  # the program imports it by name when it runs, after this
    sys.argv = [program, *args]
    try:
        runpy.run_path(program, run_name="__main__")
    finally:
        write_stamps()


if __name__ == "__main__":
    main()
