"""transformers' "heuristic" schedule for assisted decoding: k grows after a fully accepted round."""
from __future__ import annotations

from dataclasses import dataclass

from sparsespec.options import OptionSet, at_least, option
from sparsespec.controllers.fixed import FixedK


class HeuristicK(FixedK):
    """transformers' "heuristic" schedule for assisted decoding: k += 2 after a round where every
    draft was accepted, k -= 1 (never below 1) otherwise. A batch counts as fully accepted only if
    every sequence accepted every draft (its worst sequence decides)."""

    name = "heuristic"

    @dataclass(frozen=True)
    class Options(OptionSet):
        k: int = option(20, "transformers' num_assistant_tokens default", check=at_least(1))
        max_k: int = option(64, "a ceiling, so the preallocated cache has room for a round", check=at_least(1))

    @property
    def max_k(self) -> int:
        return max(self.opts.max_k, self.opts.k)

    def observe_batch(self, entropies, accepted, submitted, draft_step_s, verify_s, round_s=None) -> None:
        if submitted:
            self.k = min(self.k + 2, self.max_k) if min(accepted) == submitted else max(self.k - 1, 1)
