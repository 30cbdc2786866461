"""One registered attention function, `"sparsespec"`, whose behaviour is chosen per forward call.

`model(..., attn_hook=hook)` reaches every attention layer through transformers' kwargs. With no
hook, the layer runs transformers' own SDPA attention (prefill, plain decoding, drafting over a
gathered draft cache). A hook replaces it for one forward:

- `ObservationHook` (prefill): SDPA output, plus the attention that the last `window` prompt
  queries pay to each position, reduced per KV head. It seeds the first round's top-K (SnapKV-style).
- `ExplicitAttentionHook` (verification, every speculative method): attention computed explicitly
  in packed-GQA form, out = P @ V. No `repeat_kv`, and no slow masked-SDPA fallback on CPU.
- `RecordingHook` (SparseSpec-L's verification): the same, and sum_{queries, group heads} P is
  recorded per layer and KV head. No second attention pass.
- `attend_all` (drafting over a gathered draft cache): SDPA with no mask.
- `OracleHook` (the oracle baseline's drafting): the true full attention of the draft query picks
  the top-K positions per KV head, and the query then attends to those positions only.

Shapes: query (B, H, q, D) after RoPE; key/value (B, Hkv, N, D) as the cache returned them;
output (B, q, H, D). Query head h reads KV head h // G, G = H / Hkv.
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_IMPLEMENTATION = "sparsespec"


def sparsespec_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                         attn_hook=None, **kwargs):
    if attn_hook is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    return attn_hook(module, query, key, value, attention_mask, scaling, **kwargs)


def attend_all(module, query, key, value, attention_mask, scaling, **kwargs):
    """Drafting over a gathered draft cache: the single query sees every cached position, so the
    mask (built for the draft cache's own, non-absolute positions) is ignored. A sliding-window
    layer keeps only its last `window` entries: the gathered positions lie inside the window, and
    a dense gather is in position order, so the draft then sees exactly what the target sees."""
    window = kwargs.get("sliding_window")
    if window is not None and key.shape[2] > window:
        key, value = key[:, :, -window:], value[:, :, -window:]
    return sdpa_attention_forward(module, query, key, value, None, scaling=scaling, **kwargs)


def register() -> None:
    """Idempotent. The mask must be registered too, or transformers silently passes masks of None."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, sparsespec_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)


register()


# --- packed-GQA attention with explicit probabilities ---------------------------------------------

def visible_keys(attention_mask, q: int, n: int, device) -> torch.Tensor:
    """(B|1, 1, q, n) bool, True where a query may attend. A mask of None means plain causal
    attention with the q queries at the last q positions (transformers skips the mask then)."""
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            return attention_mask
        return attention_mask == 0  # additive float mask
    q_pos = torch.arange(n - q, n, device=device).unsqueeze(1)
    return (torch.arange(n, device=device).unsqueeze(0) <= q_pos).view(1, 1, q, n)


def grouped_attention_probs(query, key, visible, scaling) -> torch.Tensor:
    """Softmax attention probabilities in packed-GQA layout: (B, Hkv, G, q, N), float32."""
    b, h, q, d = query.shape
    hkv, n = key.shape[1], key.shape[2]
    g = h // hkv
    qg = query.reshape(b, hkv, g * q, d)                                   # (B, Hkv, G*q, D)
    scores = torch.matmul(qg, key.transpose(-1, -2)).float() * scaling     # (B, Hkv, G*q, N)
    scores = scores.view(b, hkv, g, q, n)
    if visible is not None:
        scores = scores.masked_fill(~visible.view(visible.shape[0], 1, 1, q, n), float("-inf"))
    return torch.softmax(scores, dim=-1)


def apply_probs(probs, value, dtype) -> torch.Tensor:
    """out = P @ V in packed-GQA layout, returned as (B, q, H, Dv)."""
    b, hkv, g, q, n = probs.shape
    out = torch.matmul(probs.to(dtype).view(b, hkv, g * q, n), value)     # (B, Hkv, G*q, Dv)
    return out.view(b, hkv * g, q, -1).transpose(1, 2).contiguous()


class ExplicitAttentionHook:
    """Verification of several tokens: attention from explicit probabilities in packed-GQA form.

    Every speculative method verifies this way, so they all pay the same verification. It is also
    the fast path on a CPU: SDPA with a mask over a long cache falls back to a slow kernel there
    (SmolLM2, 5 queries over 8K: 623 ms for the whole verification against 152 ms this way)."""

    def __call__(self, module, query, key, value, attention_mask, scaling, **kwargs):
        q, n = query.shape[2], key.shape[2]
        visible = visible_keys(attention_mask, q, n, query.device)
        probs = grouped_attention_probs(query, key, visible, scaling)
        self.record(module.layer_idx, probs)
        return apply_probs(probs, value, query.dtype), None

    def record(self, layer_idx: int, probs: torch.Tensor) -> None:
        pass


class RecordingHook(ExplicitAttentionHook):
    """Verification that also records per-layer position importance for the next round's top-K.

    `scores[layer]` is (Hkv, N): attention received by each position, summed over the verification
    queries and over the query heads of each KV group.
    """

    def __init__(self):
        self.scores: dict[int, torch.Tensor] = {}

    def record(self, layer_idx: int, probs: torch.Tensor) -> None:
        self.scores[layer_idx] = probs[0].sum(dim=(1, 2))                # (Hkv, N)


class ObservationHook:
    """Prefill: SDPA output, plus the importance of each position seen from the last `window` queries."""

    def __init__(self, window: int):
        self.window = window
        self.scores: dict[int, torch.Tensor] = {}

    def __call__(self, module, query, key, value, attention_mask, scaling, **kwargs):
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        q, n = query.shape[2], key.shape[2]
        self.observe(module.layer_idx, query, key, visible_keys(attention_mask, q, n, query.device), scaling)
        return out, None

    def observe(self, layer_idx: int, query, key, visible, scaling) -> None:
        """Score positions from the last `window` queries; `visible` is (B|1, 1, q, N) bool. Observe
        only: the layer's output is computed elsewhere (once, when several observers share a prefill)."""
        q = query.shape[2]
        w = min(self.window, q)
        probs = grouped_attention_probs(query[:, :, q - w:, :], key, visible[:, :, q - w:, :], scaling)
        self.scores[layer_idx] = probs[0].sum(dim=(1, 2))


class OracleHook:
    """Drafting with the current step's true attention: keep sinks, the recent window and the top-K
    positions of this very query's full attention (per KV head), renormalise over them.

    It reads the whole cache, so it is an upper bound on selection quality, not a speed-up."""

    def __init__(self, sink: int, recent: int, topk: int):
        self.sink, self.recent, self.topk = sink, recent, topk

    def __call__(self, module, query, key, value, attention_mask, scaling, **kwargs):
        q, n = query.shape[2], key.shape[2]
        visible = visible_keys(attention_mask, q, n, query.device)
        probs = grouped_attention_probs(query, key, visible, scaling)      # (1, Hkv, G, 1, N)
        budget = self.sink + self.recent + self.topk
        if n > budget:
            importance = probs[0].sum(dim=(1, 2))                          # (Hkv, N)
            keep = torch.zeros_like(importance, dtype=torch.bool)
            keep[:, :self.sink] = True
            keep[:, n - self.recent:] = True
            middle = importance[:, self.sink:n - self.recent]
            top = middle.topk(self.topk, dim=-1).indices + self.sink
            keep.scatter_(1, top, True)
            probs = probs * keep.view(1, keep.shape[0], 1, 1, n)
            probs = probs / probs.sum(dim=-1, keepdim=True)
        return apply_probs(probs, value, query.dtype), None


class StaticDraftHook:
    """Drafting over a `StaticDraftCache`: the query attends to the slots whose absolute position it
    may see (filled, not in its future, inside a sliding window), per KV head; packed-GQA SDPA.

    The mask comes from tensors only, so the draft step has fixed shapes end to end."""

    def __init__(self, cache):
        self.cache = cache

    def __call__(self, module, query, key, value, attention_mask, scaling, **kwargs):
        b, h, q, d = query.shape                                        # q == 1 while drafting
        hkv = key.shape[1]
        layer = self.cache.layers[module.layer_idx]
        qpos = self.cache.query_position.view(1, 1)
        visible = (layer.positions >= 0) & (layer.positions <= qpos)    # (Hkv, C)
        window = kwargs.get("sliding_window")
        if window is not None:
            visible &= layer.positions > qpos - window
        qg = query.reshape(b, hkv, (h // hkv) * q, d)                   # (B, Hkv, G, D)
        out = torch.nn.functional.scaled_dot_product_attention(
            qg, key, value, attn_mask=visible.view(1, hkv, 1, -1), scale=scaling)
        return out.view(b, h, q, -1).transpose(1, 2).contiguous(), None  # (B, q, H, Dv)
