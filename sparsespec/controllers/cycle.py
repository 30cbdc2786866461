"""Cycle k through a list, one k per round: the calibration profile's controller."""
from __future__ import annotations

from dataclasses import dataclass

from sparsespec.options import OptionSet, at_least, non_empty, option
from sparsespec.controllers.fixed import FixedK


class CycleK(FixedK):
    """Cycle through `ks`, one k per round: the calibration profile's controller (every k is
    measured on the same prompt and cache, repeatedly, before anything is timed; k = 0 is a round
    with no draft, one AR step)."""

    name = "cycle"

    @dataclass(frozen=True)
    class Options(OptionSet):
        ks: tuple[int, ...] = option((1, 2, 4, 8, 12, 16), "spans the entropy controller's candidates, so "
                                                             "C_v(k)'s line is fitted, not extrapolated",
                                     check=non_empty(at_least(0)))

    def __init__(self, **options):
        super(FixedK, self).__init__(**options)       # FixedK's own option k does not apply
        self.ks = list(self.opts.ks)
        self.rounds = 0
        self.k = self._limit = self.ks[0]

    @property
    def max_k(self) -> int:
        return max(self.ks)

    def start_round(self, limit: int) -> int:
        self.k = self.ks[self.rounds % len(self.ks)]
        self._limit = min(self.k, limit)
        return self._limit

    def observe_batch(self, entropies, accepted, submitted, draft_step_s, verify_s, round_s=None) -> None:
        self.rounds += 1
