"""The intra-op thread count a generation runs with: the counts a run compares (1 and the process's
default) and a block run at a given count. Which count each method gets is measured by the harness
(sparsespec/harness/thread_choice.py, sparsespec/harness/calibration.py)."""
from __future__ import annotations

import contextlib

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
