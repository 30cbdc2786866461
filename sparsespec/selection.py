"""Which cached positions the sparse draft attends to, and gathering their K/V.

Per layer and per KV head the draft sees M = sink + recent + topk positions of the L cached ones:
- sinks: positions [0, sink), the attention sinks of StreamingLLM;
- recent: the last `recent` positions [L - recent, L);
- top-K: the `topk` highest-scoring positions in between, by the attention they received in the
  last verification pass (or the prefill observation window before the first round).
When L <= M the draft is dense: every position, in order.
For a sliding-window layer only positions inside the window are candidates (the target cannot see
the others); when the window has moved past the sinks, their share goes to the recent window.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Budget:
    sink: int
    recent: int
    topk: int

    @property
    def total(self) -> int:
        return self.sink + self.recent + self.topk


def select_topk_positions(scores: torch.Tensor, length: int, budget: Budget, window_start: int = 0) -> torch.Tensor:
    """Positions for the draft of one layer: (Hkv, M) long, M = min(budget.total, length - window_start).

    scores: (Hkv, >= length) importance of each cached position (only [:length] is read)."""
    hkv, device = scores.shape[0], scores.device
    n = length - window_start
    if n <= budget.total:
        return torch.arange(window_start, length, device=device).expand(hkv, n)
    sink = budget.sink if window_start == 0 else 0
    recent = budget.recent + budget.sink - sink
    lo, hi = window_start + sink, length - recent              # top-K candidates: [lo, hi)
    parts = []
    if sink:
        parts.append(torch.arange(0, sink, device=device).expand(hkv, sink))
    if budget.topk:
        parts.append(scores[:, lo:hi].topk(budget.topk, dim=-1, sorted=False).indices + lo)
    if recent:
        parts.append(torch.arange(hi, length, device=device).expand(hkv, recent))
    return torch.cat(parts, dim=-1)


def gather_positions(keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor):
    """Gather per-KV-head positions from a (1, Hkv, C, D) buffer -> (1, Hkv, M, D).

    One flattened `index_select` over (Hkv*C, D) rows: flat index = head * C + position."""
    _, hkv, cap, d = keys.shape
    m = positions.shape[-1]
    flat = (positions + torch.arange(hkv, device=positions.device).unsqueeze(1) * cap).reshape(-1)
    k = keys.reshape(hkv * cap, d).index_select(0, flat).view(1, hkv, m, d)
    v = values.reshape(hkv * cap, values.shape[-1]).index_select(0, flat).view(1, hkv, m, -1)
    return k, v


def sliding_window_of(model, layer_idx: int) -> int | None:
    """The layer's sliding window, or None for full attention (Llama; Mistral and Qwen2 per config)."""
    config = model.config.get_text_config()
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and layer_types[layer_idx] != "sliding_attention":
        return None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return window


def window_start(window: int | None, length: int) -> int:
    """First position a query at `length` can see in a sliding window (mask: kv > q - window)."""
    return 0 if window is None else max(0, length - window + 1)
