"""`snapkv_static`: top-K chosen once, from the attention the last `obs_window` prompt queries pay
to each position at prefill (SnapKV's observation window), and never refreshed. It isolates what
recycling the verification attention (`sparsespec`) adds. Verification observes nothing."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sparsespec.engine.attention import window_attention_received
from sparsespec.options import at_least, option
from sparsespec.methods.policies.base import GatheredOptions, KVPolicy


class SnapKVStaticPolicy(KVPolicy):
    name = "snapkv_static"

    @dataclass(frozen=True)
    class Options(GatheredOptions):
        obs_window: int = option(16, "prefill queries that seed round one (the paper recycles 16 queries)",
                                 check=at_least(1))

    def __init__(self, model, *, obs_window: int, **common):
        super().__init__(model, **common)
        self.obs_window = obs_window
        self.importance: list[torch.Tensor] | None = None     # per layer (Hkv, capacity)
        self.observed: dict[int, torch.Tensor] = {}            # per layer (Hkv, N), one pass's

    def prefill_observer(self):
        return self.observe_prefill if self.budget.topk > 0 else None

    def prefill_query_rows(self) -> int:
        return self.obs_window if self.prefill_observer() is not None else 0

    def observe_prefill(self, layer, query, key, visible, scaling) -> None:
        self.observed[layer] = window_attention_received(query, key, visible, scaling, self.obs_window)

    def after_prefill(self, state) -> None:
        if not self.observed:
            return
        capacity = state.ids.shape[0]
        self.importance = [torch.zeros(s.shape[0], capacity, device=s.device, dtype=torch.float32)
                           for s in (self.observed[i] for i in range(len(self.observed)))]
        self.absorb(self.observed)

    def absorb(self, observed: dict[int, torch.Tensor]) -> None:
        """importance[:, :N] <- this pass's attention received (Hkv, N)."""
        for layer, new in observed.items():
            self.importance[layer][:, :new.shape[-1]].copy_(new)
        observed.clear()

    def scores(self, layer):
        return None if self.importance is None else self.importance[layer]
