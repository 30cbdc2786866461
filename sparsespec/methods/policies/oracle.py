"""`oracle`: an upper bound on selection quality. Every draft step attends to the top-K positions
of its own true full attention (per layer and KV head, summed over the KV group's query heads),
plus the sinks and the recent window, at the same budget as `sparsespec`.

Each draft step reads the whole cache to find those positions, so this is not a speed-up method:
its acceptance rate is the ceiling for any top-K selection policy at this budget."""
from __future__ import annotations

from sparsespec.engine.attention import attention_received, grouped_attention_probs, visible_keys
from sparsespec.engine.selection import select_topk_positions
from sparsespec.methods.policies.base import BudgetOptions, QueryAwarePolicy


class OraclePolicy(QueryAwarePolicy):
    name = "oracle"
    Options = BudgetOptions     # drafts with the target's own weights

    def select_for_query(self, layer, query, key, visible, scaling, length, window_start):
        q, n = query.shape[2], key.shape[2]
        probs = grouped_attention_probs(query, key, visible_keys(visible, q, n, query.device), scaling)
        return select_topk_positions(attention_received(probs), length, self.budget, window_start)
