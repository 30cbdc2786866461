"""Wall-clock timing that waits for the accelerator, so GPU work is counted where it happens."""
from __future__ import annotations

import time

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


class Stopwatch:
    """`with watch: ...` adds the block's synchronised wall time to `watch.seconds`."""

    def __init__(self, device: torch.device):
        self.device = device
        self.seconds = 0.0

    def __enter__(self):
        synchronize(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        synchronize(self.device)
        self.seconds += time.perf_counter() - self._start
        return False


class RoundTimers:
    """The three stopwatches of one round of the decode loop (sparsespec/engine/loop.py)."""
    def __init__(self, device):
        self.select, self.draft, self.verify = Stopwatch(device), Stopwatch(device), Stopwatch(device)

    @property
    def seconds(self) -> float:
        """The whole round: KV selection, every draft step run, verification."""
        return self.select.seconds + self.draft.seconds + self.verify.seconds
