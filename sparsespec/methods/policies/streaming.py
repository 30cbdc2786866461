"""`streaming`: a StreamingLLM draft cache (MagicDec-style self-speculation): the sinks and a recent
window, nothing chosen by score. The whole budget beyond the sinks goes to the recent window, so it
drafts at the same budget as `sparsespec`. Observes nothing, so prefill and verification cost
nothing extra."""
from __future__ import annotations

from sparsespec.engine.selection import Budget
from sparsespec.methods.policies.base import GatheredOptions, KVPolicy


class StreamingPolicy(KVPolicy):
    name = "streaming"
    Options = GatheredOptions.subset("StreamingOptions", "sink", "budget", "draft_weights", "static_draft",
                                     "compile_draft")

    def resolve_budget(self, prompt_len, max_length, *, sink, recent, topk, budget):
        total, note = super().resolve_budget(prompt_len, max_length, sink=sink, recent=0, topk=None, budget=budget)
        return Budget(total.sink, total.recent + total.topk, 0), note
