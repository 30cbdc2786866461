"""Upper bound on selection quality: draft with the top-K positions of the *current* step's true
full attention (per layer, per KV head), at the same budget as `sparsespec`.

Each draft step reads the whole cache to find those positions, so this is not a speed-up method:
its acceptance rate is the ceiling for any top-K selection policy at this budget."""
from __future__ import annotations

import torch

from ..attention import OracleHook
from .base import DecodeState, ModelDrafter
from .sparse_kv import SparseKVDrafter, resolve_budget


class OracleDrafter(ModelDrafter):
    name = "oracle"
    Options = SparseKVDrafter.Options.subset("OracleOptions", "sink", "recent", "topk", "budget")

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        o = self.opts
        self.budget = resolve_budget(self.prompt_len, sink=o.sink, recent=o.recent, topk=o.topk, budget=o.budget)
        self.hook = OracleHook(self.budget.sink, self.budget.recent, self.budget.topk)

    def step(self, state: DecodeState, token, position) -> torch.Tensor:
        # draft tokens go into the full cache for now; `finish` rolls them back before verification
        out = self.model(input_ids=token, position_ids=torch.tensor([[position]], device=state.device),
                         past_key_values=state.cache, use_cache=True, attn_hook=self.hook, logits_to_keep=1)
        return out.logits[0, -1]

    def finish(self, state: DecodeState) -> None:
        state.cache.truncate(state.length)
