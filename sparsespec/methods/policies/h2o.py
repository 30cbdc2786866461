"""`h2o`: H2O-style heavy hitters (Zhang et al., 2023). A position's score is all the attention it
has received so far: the prefill observation window plus every verification since, summed per
layer, KV head and position over the queries and the query heads of each KV group. The draft keeps
the top-K heavy hitters, the sinks and the recent window. Nothing is evicted: the full cache stays
for verification.

Only queries that stay in the sequence count, as in H2O: of a verification's [last, d_1..d_k],
the queries of `last` and the accepted drafts. Rejected drafts' queries are dropped, and the
positions they wrote were only ever seen by themselves (causal), so nothing rolled back leaks in."""
from __future__ import annotations

import torch

from sparsespec.methods.policies.snapkv_static import SnapKVStaticPolicy


class HeavyHitterPolicy(SnapKVStaticPolicy):
    name = "h2o"
    Options = SnapKVStaticPolicy.Options      # the budget, obs_window (seeds the sums) and the draft cache

    def __init__(self, model, **common):
        super().__init__(model, **common)
        self.pending: dict[int, torch.Tensor] = {}          # per layer (Hkv, q, N): one verification

    def verification_observer(self):
        return self.observe_verification if self.budget.topk > 0 else None

    def observe_verification(self, layer, probs) -> None:
        self.pending[layer] = probs[0].sum(dim=1)            # (Hkv, G, q, N) -> (Hkv, q, N)

    def after_verify(self, state, accepted) -> None:
        for layer, per_query in self.pending.items():        # importance[:, :N] += sum of kept queries
            kept = per_query[:, :accepted + 1].sum(dim=1)     # (Hkv, N)
            self.importance[layer][:, :kept.shape[-1]].add_(kept)
        self.pending.clear()
