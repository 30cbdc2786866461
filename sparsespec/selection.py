"""Which cached positions the sparse draft attends to, and gathering their K/V.

Per layer and per KV head the draft sees M = sink + recent + topk positions of the L cached ones:
- sinks: positions [0, sink), the attention sinks of StreamingLLM;
- recent: the last `recent` positions [L - recent, L);
- top-K: the `topk` highest-scoring positions in between, by the attention they received in the
  last verification pass (or the prefill observation window before the first round).
When L <= M the draft is dense: every position, in order. Which positions fill the top-K share is the
policy's choice (`sparsespec/methods/policies/`); the regions around it are decided here, once.
For a sliding-window layer only positions inside the window are candidates (the target cannot see
the others); when the window has moved past the sinks, their share goes to the recent window.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import ConfigError


@dataclass(frozen=True)
class Budget:
    sink: int
    recent: int
    topk: int

    @property
    def total(self) -> int:
        return self.sink + self.recent + self.topk


def resolve_budget(prompt_len: int, max_length: int, *, sink: int, recent: int, topk: int | None,
                   budget: float | int) -> tuple[Budget, str | None]:
    """(Budget, note). The draft's positions per layer and KV head: an explicit `topk` on top of
    sinks and recent, or a total `budget` (a fraction < 1 of the prompt, or a token count >= 1) of
    which top-K gets what sinks and recent leave.

    Two cases give a dense draft (every position up to `max_length`, the longest the context gets)
    and a note saying why, never an error: a budget that covers the whole prompt, and one too small
    to hold sink + recent (a short prompt at a fractional budget)."""
    total = sink + recent + topk if topk is not None else round(budget * prompt_len) if budget < 1 else int(budget)
    dense = Budget(0, max_length, 0)
    if total >= prompt_len:
        return dense, f"{total} draft positions cover the whole {prompt_len}-token prompt: dense draft"
    if total < max(sink + recent, 1):
        return dense, (f"budget={budget!r} gives {total} positions at context {prompt_len}, fewer than "
                       f"sink+recent={sink + recent}: dense draft")
    return Budget(sink, recent, total - sink - recent), None


def draft_regions(length: int, budget: Budget, window_start: int = 0) -> tuple[int, int, int] | None:
    """Where one layer's draft positions come from at context `length`: (sink, lo, hi) with sinks
    [0, sink), candidates [lo, hi) for whatever the policy picks, recent [hi, length). None when
    the budget holds every visible position (a dense draft)."""
    if length - window_start <= budget.total:
        return None
    sink = budget.sink if window_start == 0 else 0             # the window moved past the sinks:
    recent = budget.recent + budget.sink - sink                # their share goes to the recent window
    return sink, window_start + sink, length - recent


def dense_positions(hkv: int, length: int, window_start: int, device) -> torch.Tensor:
    """(Hkv, length - window_start): every visible position, in order."""
    return torch.arange(window_start, length, device=device).expand(hkv, length - window_start)


def join_positions(sink: int, middle: torch.Tensor, hi: int, length: int) -> torch.Tensor:
    """(Hkv, M): sinks [0, sink), the policy's picks `middle` (Hkv, K), recent [hi, length)."""
    hkv, device = middle.shape[0], middle.device
    parts = []
    if sink:
        parts.append(torch.arange(0, sink, device=device).expand(hkv, sink))
    if middle.shape[-1]:
        parts.append(middle)
    if length > hi:
        parts.append(torch.arange(hi, length, device=device).expand(hkv, length - hi))
    return torch.cat(parts, dim=-1)


def select_topk_positions(scores: torch.Tensor, length: int, budget: Budget, window_start: int = 0) -> torch.Tensor:
    """Positions for the draft of one layer: (Hkv, M) long, M = min(budget.total, length - window_start).

    scores: (Hkv, >= length) importance of each cached position (only [:length] is read)."""
    regions = draft_regions(length, budget, window_start)
    if regions is None:
        return dense_positions(scores.shape[0], length, window_start, scores.device)
    sink, lo, hi = regions
    top = scores[:, lo:hi].topk(budget.topk, dim=-1, sorted=False).indices + lo if budget.topk \
        else scores.new_empty(scores.shape[0], 0, dtype=torch.long)
    return join_positions(sink, top, hi, length)


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
