"""A fixed k: every round drafts k tokens (fewer only when the output budget ends)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from sparsespec.options import OptionSet, at_least, option
from sparsespec.controllers.base import Controller


class FixedK(Controller):
    """Always draft k tokens (fewer only when the output budget ends). Reads no entropy and no cost."""

    name = "fixed"

    @dataclass(frozen=True)
    class Options(OptionSet):
        k: int = option(4, "short enough that a rejected draft wastes little, long enough to pay for a verification", check=at_least(1))

    def __init__(self, k: int | None = None, **options):
        super().__init__(**options, **({} if k is None else {"k": k}))
        self.k = self.opts.k
        self._limit = self.k

    @property
    def max_k(self) -> int:
        return self.k

    def use_cost_prior(self, profile) -> None:
        """A fixed k ignores costs."""

    def start_round(self, limit: int) -> int:
        self._limit = min(self.k, limit)
        return self._limit

    def keep_drafting_batch(self, entropies: Sequence[Sequence[float]]) -> bool:
        return len(entropies[0]) < self._limit

    def submit_count(self, drafted: int) -> int:
        return drafted

    def observe_batch(self, entropies, accepted, submitted, draft_step_s, verify_s, round_s=None) -> None:
        pass

    def trace(self) -> dict:
        return {}
