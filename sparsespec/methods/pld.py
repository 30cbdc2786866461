"""Prompt-lookup decoding: draft the tokens that followed the latest earlier occurrence of the
last n-gram (n = max_ngram down to 1) in the prompt and output so far. No model runs to draft.

Drafts are deterministic, so under sampling the draft distribution is one-hot (q(d) = 1) and the
rejection rule accepts d with probability p(d)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sparsespec.options import OptionSet, at_least, option
from sparsespec.engine.batch_cache import BatchCache
from sparsespec.engine.proposers import BatchDraft
from sparsespec.methods.base import Drafter


def lookup_continuation(history: torch.Tensor, max_ngram: int, limit: int) -> torch.Tensor:
    """Up to `limit` tokens that followed the most recent earlier match of the longest matching
    suffix n-gram of `history` (1-D). Empty when nothing matches."""
    for n in range(max_ngram, 0, -1):
        if history.numel() <= n:
            continue
        windows = history[:-1].unfold(0, n, 1)                       # (L - n, n): every earlier n-gram
        hits = (windows == history[-n:]).all(dim=1).nonzero().flatten()
        if hits.numel():
            start = int(hits[-1]) + n
            return history[start:start + limit]
    return history[:0]


class PromptLookupDrafter(Drafter):
    name = "pld"
    drafts_have_entropy = False         # drafts are looked up, not sampled: no entropy to read
    batchable = True
    controller_defaults = {"k": 10}     # transformers' prompt_lookup_num_tokens default

    @dataclass(frozen=True)
    class Options(OptionSet):
        max_ngram: int = option(2, "transformers' max_matching_ngram_size default", check=at_least(1))

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        self.max_ngram = self.opts.max_ngram

    def batch_proposer(self, windows: list) -> "LookupProposer":
        return LookupProposer(self.max_ngram, self.max_k)


class LookupProposer:
    """Prompt lookup for a batch: each sequence looks up its own continuation; the batch drafts as
    many tokens as the controller allows and the longest lookup has. A sequence with a shorter lookup
    pads it with its last token: a deterministic draft like any other (greedy rejects it unless the
    target agrees; sampling accepts it with probability p(d), q being one-hot), so nothing is lost."""

    def __init__(self, max_ngram: int, max_k: int):
        self.max_ngram, self.max_k = max_ngram, max_k

    def draft(self, target: BatchCache, seqs: list, last: torch.Tensor, controller, sampler, timers) -> BatchDraft:
        out = BatchDraft()
        with timers.draft:
            proposals = [lookup_continuation(s.state.history(), self.max_ngram, self.max_k) for s in seqs]
            for j in range(max(p.numel() for p in proposals)):
                out.tokens.append(torch.stack([p[j] if j < p.numel() else (p[-1] if p.numel() else s.state.last.view(()))
                                               for p, s in zip(proposals, seqs)]))          # (B,)
                out.entropies.append([0.0] * len(seqs))
                if not controller.keep_drafting_batch([[0.0] * (j + 1) for _ in seqs]):
                    break
        return out
