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

from sparsespec.errors import ConfigError


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
    """(..., M): sinks [0, sink), the policy's picks `middle` (..., K), recent [hi, length); the
    leading dims (KV heads, and layers when selected together) are `middle`'s."""
    lead, device = middle.shape[:-1], middle.device
    parts = []
    if sink:
        parts.append(torch.arange(0, sink, device=device).expand(*lead, sink))
    if middle.shape[-1]:
        parts.append(middle)
    if length > hi:
        parts.append(torch.arange(hi, length, device=device).expand(*lead, length - hi))
    return torch.cat(parts, dim=-1)


def select_topk_positions(scores: torch.Tensor, length: int, budget: Budget, window_start: int = 0) -> torch.Tensor:
    """One sequence's draft positions for one layer: (Hkv, M) long, M = min(budget.total, length - window_start).

    scores: (Hkv, >= length) importance of each cached position (only [:length] is read)."""
    return select_topk_batch([scores], [length], [budget], [window_start])[0]


def select_topk_batch(scores: list, lengths: list[int], budgets: list[Budget], window_starts: list[int]) -> torch.Tensor:
    """A batch's draft positions: (B, ..., Hkv, max M_b), -1 where sequence b has fewer.

    scores[b]: (..., Hkv, >= L_b) importance of sequence b's cached positions, for one layer (Hkv, C)
    or for several layers that share the window starts at once (layers, Hkv, C): one top-k for all
    of them is cheaper than one a layer. The top-K shares come from one top-k over a
    (B, ..., Hkv, span) tensor: each row's candidates [lo_b, hi_b), -inf elsewhere."""
    regions = [draft_regions(n, budget, ws) for n, budget, ws in zip(lengths, budgets, window_starts)]
    shares = [budget.topk if region is not None else 0 for region, budget in zip(regions, budgets)]
    picks = top_k_picks(scores, regions, shares)
    rows = []
    for b, (s, n, region, share, ws) in enumerate(zip(scores, lengths, regions, shares, window_starts)):
        if region is None:
            rows.append(dense_positions(1, n, ws, s.device).expand(*s.shape[:-1], n - ws))
            continue
        sink, _, hi = region
        middle = picks[b, ..., :share] if share else s.new_empty(*s.shape[:-1], 0, dtype=torch.long)
        rows.append(join_positions(sink, middle, hi, n))
    return pad_positions(rows)


def top_k_picks(scores: list, regions: list, shares: list[int]) -> torch.Tensor | None:
    """(B, ..., Hkv, max K_b) positions of the K_b highest scores in each row's [lo_b, hi_b), or None
    when no row has a top-K share. A row taking fewer than the most reads the first K_b of a sorted
    top-k (the others' ranks do not matter: sorted only then). A batch of one ranks its own scores
    in place (no copy)."""
    most = max(shares)
    if not most:
        return None
    if len(scores) == 1:
        _, lo, hi = regions[0]
        return (scores[0][..., lo:hi].topk(most, dim=-1, sorted=False).indices + lo).unsqueeze(0)
    first = min(r[1] for r, k in zip(regions, shares) if k)
    last = max(r[2] for r, k in zip(regions, shares) if k)
    ref = next(s for s, k in zip(scores, shares) if k)
    ranked = ref.new_full((len(scores), *ref.shape[:-1], last - first), float("-inf"))     # (B, ..., Hkv, span)
    for b, (region, share) in enumerate(zip(regions, shares)):
        if share:
            _, lo, hi = region
            ranked[b, ..., lo - first:hi - first] = scores[b][..., lo:hi]
    sort = any(0 < k < most for k in shares)
    return ranked.topk(most, dim=-1, sorted=sort).indices + first


def gather_positions(keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor):
    """keys/values (B, Hkv, C, D), positions (B, Hkv, M) (-1 = padding, read as slot 0) ->
    (B, Hkv, M, D) each: one flattened `index_select` over (B*Hkv*C, D) rows,
    flat index = (b * Hkv + head) * C + position."""
    b, h, c, d = keys.shape
    m = positions.shape[-1]
    base = (torch.arange(b, device=keys.device).view(b, 1, 1) * h
            + torch.arange(h, device=keys.device).view(1, h, 1)) * c
    flat = (positions.clamp_min(0) + base).reshape(-1)                                # (B*Hkv*M,)
    k = keys.reshape(b * h * c, d).index_select(0, flat).view(b, h, m, d)
    v = values.reshape(b * h * c, values.shape[-1]).index_select(0, flat).view(b, h, m, -1)
    return k, v


def pad_positions(per_seq: list[torch.Tensor]) -> torch.Tensor:
    """Per-sequence (..., M_b) positions -> (B, ..., max M_b), -1 where a sequence has fewer."""
    if len(per_seq) == 1:
        return per_seq[0].unsqueeze(0)
    m = max(p.shape[-1] for p in per_seq)
    out = per_seq[0].new_full((len(per_seq), *per_seq[0].shape[:-1], m), -1)
    for b, p in enumerate(per_seq):
        out[b, ..., :p.shape[-1]] = p
    return out


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
