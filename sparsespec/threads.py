"""The intra-op thread count a generation runs with: the counts compared (1 and the process's
default), a block run at a given count, and what a switch between counts costs. The decode loop
chooses among the counts online (sparsespec/engine/thread_rule.py); the harness's probe gives it a
starting count (sparsespec/harness/thread_choice.py, sparsespec/harness/calibration.py)."""
from __future__ import annotations

import contextlib
import functools
import statistics
import time

import torch

DEFAULT_THREADS = torch.get_num_threads()   # the process's count before any choice: OMP_NUM_THREADS or the cores


def thread_counts(default: int | None = None) -> tuple[int, ...]:
    """The counts a run compares: 1 and the default (one count when the default is 1)."""
    return tuple(sorted({1, DEFAULT_THREADS if default is None else default}))


@contextlib.contextmanager
def using(threads: int | None):
    """Run the block with `threads` intra-op threads (None: as it is), then restore the count."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


SWITCH_REPEATS = 200   # switches timed: a median over enough to ignore one scheduler slice


@functools.lru_cache(maxsize=None)
def switch_cost_s(counts: tuple[int, ...] | None = None, repeats: int = SWITCH_REPEATS) -> float:
    """Median seconds of one `torch.set_num_threads` switch and the first parallel op after it, less
    the same op without a switch (a 2-row product, the smallest verification). Measured once per
    process and set of counts."""
    counts = counts or thread_counts()
    x, w = torch.randn(2, 256), torch.randn(256, 256)

    def median_op_s(switch: bool) -> float:
        times = []
        for i in range(repeats):
            start = time.perf_counter()
            if switch:
                torch.set_num_threads(counts[i % len(counts)])
            x @ w
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    with using(torch.get_num_threads()):
        return max(median_op_s(True) - median_op_s(False), 0.0)
