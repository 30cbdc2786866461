"""`quest`: Quest-style query-aware page selection at draft time (Tang et al., 2024).

The full cache is split into pages of `page_size` positions. Each page keeps, per layer and KV
head, the per-channel min and max of its keys (after RoPE), updated incrementally as the cache
grows and rolls back. For the current draft query q (the G query heads of a KV group), a page's
upper bound on its attention logits is

    bound(page) = sum_g sum_d max(q_gd * min_d, q_gd * max_d)
                = sum_d (sum_g q_gd^+) * max_d - (sum_g q_gd^-) * min_d     (q^+, q^- >= 0 parts)

and the draft attends to the sinks, the recent window and the pages with the highest bounds, as
many whole pages as the top-K share holds (its remainder is left unused). Candidate pages lie
wholly between the sinks and the recent window. Selection is per draft step, from the draft
query itself, so the draft runs over the full cache (`QueryAwareDraftHook`)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sparsespec.options import at_least, one_of, option
from sparsespec.engine.selection import dense_positions, draft_regions, join_positions
from sparsespec.methods.policies.base import BudgetOptions, QueryAwarePolicy


def page_key_bounds(keys: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """keys (Hkv, N, D) -> per-page channel (min, max), each (Hkv, ceil(N / page_size), D); the
    last page may be partial."""
    hkv, n, d = keys.shape
    full = n // page_size
    pages = keys[:, :full * page_size].reshape(hkv, full, page_size, d)
    low, high = pages.amin(dim=2), pages.amax(dim=2)
    if n > full * page_size:
        tail = keys[:, full * page_size:]
        low = torch.cat([low, tail.amin(dim=1, keepdim=True)], dim=1)
        high = torch.cat([high, tail.amax(dim=1, keepdim=True)], dim=1)
    return low, high


def page_upper_bounds(query: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """query (Hkv, G, D), page (min, max) (Hkv, P, D) -> (Hkv, P): sum_g sum_d max(q*min, q*max),
    an upper bound on sum_g q . k for every key k in the page."""
    positive = query.clamp(min=0).sum(dim=1)                                   # (Hkv, D)
    negative = (-query).clamp(min=0).sum(dim=1)                                # (Hkv, D)
    return (torch.matmul(high, positive.unsqueeze(-1)) - torch.matmul(low, negative.unsqueeze(-1))).squeeze(-1)


class QuestPolicy(QueryAwarePolicy):
    name = "quest"

    @dataclass(frozen=True)
    class Options(BudgetOptions):
        page_size: int = option(16, "Quest's page (chunk) size in tokens", check=at_least(1))
        draft_weights: str = option("auto", "as sparsespec's; no bfloat16: draft K/V go into the full cache",
                                    check=one_of("auto", "full", "int8"))

    def __init__(self, model, *, page_size: int, **common):
        super().__init__(model, **common)
        self.page_size = page_size
        self.low: list[torch.Tensor] = []       # per layer (Hkv, pages, D): channel min of each page's keys
        self.high: list[torch.Tensor] = []      # per layer (Hkv, pages, D): channel max
        self.paged = 0                          # positions the page bounds describe

    def after_prefill(self, state) -> None:
        if self.budget.topk < self.page_size:  # no whole page fits: sinks + recent only
            return
        pages = -(-state.ids.shape[0] // self.page_size)
        for layer in state.cache.layers:
            hkv, d = layer.keys.shape[1], layer.keys.shape[3]
            self.low.append(layer.keys.new_zeros(hkv, pages, d, dtype=torch.float32))
            self.high.append(layer.keys.new_zeros(hkv, pages, d, dtype=torch.float32))
        self.update_pages(state)

    def after_verify(self, state, accepted) -> None:
        if self.low:
            self.update_pages(state)

    def update_pages(self, state) -> None:
        """Recompute the pages between the old and the new length (only the last page or two)."""
        first = min(self.paged, state.length) // self.page_size
        for layer, low, high in zip(state.cache.layers, self.low, self.high):
            keys = layer.keys[0, :, first * self.page_size:state.length].float()    # (Hkv, n, D)
            new_low, new_high = page_key_bounds(keys, self.page_size)
            low[:, first:first + new_low.shape[1]] = new_low
            high[:, first:first + new_high.shape[1]] = new_high
        self.paged = state.length

    def select_for_query(self, layer, query, key, visible, scaling, length, window_start):
        hkv = key.shape[1]
        regions = draft_regions(length, self.budget, window_start)
        if regions is None:
            return dense_positions(hkv, length, window_start, key.device)
        sink, lo, hi = regions
        size = self.page_size
        first, end = -(-lo // size), hi // size                                # whole pages in [lo, hi)
        keep = min(self.budget.topk // size, max(end - first, 0))
        if keep == 0:
            return join_positions(sink, key.new_empty(hkv, 0, dtype=torch.long), hi, length)
        q = query[0, :, -1].float().view(hkv, -1, query.shape[-1])            # (Hkv, G, D)
        bounds = page_upper_bounds(q, self.low[layer][:, first:end], self.high[layer][:, first:end])
        pages = bounds.topk(keep, dim=-1, sorted=False).indices + first        # (Hkv, keep)
        middle = (pages.unsqueeze(-1) * size + torch.arange(size, device=pages.device)).flatten(1)
        return join_positions(sink, middle, hi, length)
