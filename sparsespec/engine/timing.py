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
    """`with watch: ...` adds the block's synchronised wall time to `watch.seconds`. With a `label`,
    the block is also a `torch.profiler.record_function` range of that name, so a profile of the
    decode loop shows its phases (experiments/cost_breakdown.py)."""

    def __init__(self, device: torch.device, label: str | None = None):
        self.device, self.label = device, label
        self.seconds = 0.0
        self._range = None

    def __enter__(self):
        synchronize(self.device)
        if self.label is not None and torch.autograd.profiler._is_profiler_enabled:   # free when not profiling
            self._range = torch.profiler.record_function(self.label)
            self._range.__enter__()
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        synchronize(self.device)
        self.seconds += time.perf_counter() - self._start
        if self._range is not None:
            self._range.__exit__(*exc)
            self._range = None
        return False


PHASES = ("select", "draft", "verify")


class RoundTimers:
    """The three stopwatches of one round of the decode loop (sparsespec/engine/loop.py)."""
    def __init__(self, device):
        self.select, self.draft, self.verify = (Stopwatch(device, f"round.{phase}") for phase in PHASES)

    @property
    def seconds(self) -> float:
        """The whole round: KV selection, every draft step run, verification."""
        return self.select.seconds + self.draft.seconds + self.verify.seconds
