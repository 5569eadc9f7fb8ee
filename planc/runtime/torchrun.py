"""``python -m planc.runtime.torchrun ARGS``: torchrun, with its failure report cut to what matters.

torchrun ends a failed job with its own Python traceback and a table of every rank; `planc run`
launches through this wrapper so the job ends with one line naming the rank that failed first and
how (exit code or signal), and exits 1. The arguments are torchrun's, unchanged.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except ChildFailedError as failed:
        rank, failure = failed.get_first_failure()
        if failure.exitcode < 0:
            how = f"was killed by {failure.signal_name()}"
        else:
            how = f"exited with code {failure.exitcode}"
        print(f"planc: rank {rank} {how} (the first failure); torchrun stopped the other ranks", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
