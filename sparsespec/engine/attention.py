"""One registered attention function, `"sparsespec"`, whose behaviour is chosen per forward call.

`model(..., attn_hook=hook)` reaches every attention layer through transformers' kwargs. With no
hook, the layer runs transformers' own SDPA attention (prefill, drafting). A hook replaces it for one forward:

- `ObservedPrefillHook` (prefill): SDPA output computed once, then every observer it was given
  sees `(layer_idx, query, key, visible_or_None, scaling)` and keeps its own statistics (e.g. the
  SnapKV observation window). Observers of several methods can share one prefill this way.
- Verification (`batch_cache.BatchVerifyHook`): attention from explicit probabilities in packed-GQA
  form, out = P @ V (`grouped_attention_probs`, `apply_probs`): no `repeat_kv`, and no slow
  masked-SDPA fallback on CPU; an observer receives P (B, Hkv, G, q, N) per layer (SparseSpec-L
  recycles it, no second attention pass). An AR step (one query, no observer) attends by
  `one_query_attention` instead.
- Gathered drafting (`batch_cache.BatchDraftHook`): packed-GQA SDPA over the draft cache, slot mask.
- `QueryAwareDraftHook` (drafting over the full cache): a `select` callback picks, from this very
  draft query, the cached positions each KV head attends to (oracle, Quest).

Which positions a draft sees is decided by the KV-selection policies in
`sparsespec/methods/policies/`; nothing here knows about any one policy.

Shapes: query (B, H, q, D) after RoPE; key/value (B, Hkv, N, D) as the cache returned them;
output (B, q, H, D). Query head h reads KV head h // G, G = H / Hkv.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from sparsespec.engine.selection import gather_positions, window_start

ATTN_IMPLEMENTATION = "sparsespec"


def sparsespec_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                                 attn_hook=None, **kwargs):
    if attn_hook is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    return attn_hook(module, query, key, value, attention_mask, scaling, **kwargs)


@contextmanager
def sparsespec_attention(model):
    """Run the model with the registered "sparsespec" attention; restore its own afterwards."""
    original = model.config._attn_implementation
    if original != ATTN_IMPLEMENTATION:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
    try:
        yield
    finally:
        if original != ATTN_IMPLEMENTATION:
            model.set_attn_implementation(original)


def register() -> None:
    """Idempotent. The mask must be registered too, or transformers silently passes masks of None."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, sparsespec_attention_forward)
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


def attention_received(probs: torch.Tensor) -> torch.Tensor:
    """(1, Hkv, G, q, N) probabilities -> (Hkv, N): the attention each position received, summed
    over the queries and over the query heads of each KV group."""
    return probs[0].sum(dim=(1, 2))


def window_attention_received(query, key, visible, scaling, window: int) -> torch.Tensor:
    """(Hkv, N): attention received from the last `window` queries (SnapKV's observation window).
    `visible` is a bool mask (B|1, 1, q, N) or None for plain causal attention."""
    q, n = query.shape[2], key.shape[2]
    w = min(window, q)
    visible = visible_keys(visible, q, n, query.device)[:, :, q - w:, :]
    return attention_received(grouped_attention_probs(query[:, :, q - w:, :], key, visible, scaling))


def grouped_sdpa(query, key, value, scaling, mask=None) -> torch.Tensor:
    """SDPA in packed-GQA form: (B, H, q, D) queries over (B, Hkv, M, D) keys, no `repeat_kv`;
    mask broadcastable to (B, Hkv, G*q, M) or None -> (B, q, H, Dv)."""
    b, h, q, d = query.shape
    hkv = key.shape[1]
    qg = query.reshape(b, hkv, (h // hkv) * q, d)                           # (B, Hkv, G*q, D)
    out = torch.nn.functional.scaled_dot_product_attention(qg, key, value, attn_mask=mask, scale=scaling)
    return out.view(b, h, q, -1).transpose(1, 2).contiguous()              # (B, q, H, Dv)


# --- one query per sequence: the AR step ---------------------------------------------------------

# The ways one unmasked query per sequence (an AR step, and every k = 0 round) can attend. Which is
# fastest depends on the machine, the context and the GQA ratio, so the harness measures them
# (`ar_variants`, sparsespec/harness) and library callers may choose (`generate(ar_attention=...)`).
AR_ATTENTION = ("packed_sdpa", "packed_matmul", "sdpa")
# transformers' own q = 1 packing: SDPA over (B, Hkv, G, D), no repeat_kv, no enable_gqa (on CPU,
# SDPA's enable_gqa path is the slow one, more so as the cache grows; on CUDA both are fused kernels)
DEFAULT_AR_ATTENTION = "packed_sdpa"


def one_query_attention(path: str, module, query, key, value, scaling, **kwargs) -> torch.Tensor:
    """Unmasked attention of one query per sequence over every key given -> (B, 1, H, Dv).
    `path`: "packed_sdpa" (packed-GQA SDPA), "packed_matmul" (packed-GQA softmax(q k^T) v, as
    verification computes it) or "sdpa" (transformers' SDPA: `enable_gqa` where it takes it)."""
    if path == "packed_sdpa":
        return grouped_sdpa(query, key, value, scaling)
    if path == "packed_matmul":
        return apply_probs(grouped_attention_probs(query, key, None, scaling), value, query.dtype)
    if path == "sdpa":
        return sdpa_attention_forward(module, query, key, value, None, scaling=scaling, **kwargs)[0]
    raise ValueError(f"ar_attention={path!r}; accepted: {', '.join(AR_ATTENTION)}")


class ObservedPrefillHook:
    """Prefill: transformers' SDPA output, computed once; then each observer sees
    `(layer_idx, query, key, visible_or_None, scaling)` (visible: bool (B|1, 1, q, N), None when
    the attention is plainly causal) and computes its own statistics. Observe only: no observer
    changes the output, so one prefill can serve the observers of several methods."""

    def __init__(self, observers):
        self.observers = list(observers)

    def __call__(self, module, query, key, value, attention_mask, scaling, **kwargs):
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        visible = None
        if attention_mask is not None:
            visible = visible_keys(attention_mask, query.shape[2], key.shape[2], query.device)
        for observe in self.observers:
            observe(module.layer_idx, query, key, visible, scaling)
        return out, None


class QueryAwareDraftHook:
    """Drafting over the full cache with a per-query selection: for each layer,
    `select(layer_idx, query, key, visible, scaling, length, window_start)` returns the committed
    positions (Hkv, M) in [window_start, length) this draft query attends to; this round's own
    draft tokens (positions >= `length`, written into the full cache by the draft steps) are always
    attended. `length` is set by the drafter at the start of each round.

    The draft steps' K/V go into the full cache; the drafter rolls them back before verification."""

    def __init__(self, cache, select, windows):
        self.cache, self.select, self.windows = cache, select, windows
        self.length = 0

    def __call__(self, module, query, key, value, attention_mask, scaling, **kwargs):
        layer = module.layer_idx
        n = key.shape[2]                                                   # query sits at position n - 1
        start = window_start(self.windows[layer], n - 1)
        visible = None if attention_mask is None else visible_keys(attention_mask, query.shape[2], n, query.device)
        positions = self.select(layer, query, key, visible, scaling, self.length, start)   # (Hkv, M)
        full = self.cache.layers[layer]
        keys, values = gather_positions(full.keys, full.values, positions.unsqueeze(0))
        drafted = slice(max(self.length, start), n)                        # this round's draft tokens
        keys = torch.cat([keys, key[:, :, drafted]], dim=2)
        values = torch.cat([values, value[:, :, drafted]], dim=2)
        return grouped_sdpa(query, keys, values, scaling), None
