"""The batch's caches and attention hooks: B sequences of different lengths in one set of buffers.

Cache layout (`BatchCache`). Sequence b keeps position p at slot p; slots >= L_b are free (rejected
drafts stay there until overwritten). Positions are absolute, so RoPE sees what the sequence sees
alone, and the mask is explicit: key slot j is visible to query i of sequence b iff j <= L_b + i
(and, on a sliding-window layer, j > L_b + i - window). Rollback is setting L_b: O(1), no re-padding.

`BatchDraftCache` holds a gathered sparse draft: per sequence, per layer and KV head, the positions a
policy selected (padded to the batch's widest), then one slot per draft step.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from sparsespec.engine.attention import DEFAULT_AR_ATTENTION, apply_probs, grouped_attention_probs, grouped_sdpa, one_query_attention


class OwnedLayer(CacheLayerMixin):
    """A cache layer whose lengths and positions live in its owning cache (`owner`): never sliding
    (windows come from absolute positions in the masks), never cropped, not compiled."""
    is_sliding = False
    is_croppable = False
    is_compileable = False

    def __init__(self, owner):
        super().__init__()
        self.owner = owner


class BatchLayer(OwnedLayer):
    """(B, Hkv, capacity, D) buffers; `update` writes the q new K/V of sequence b at slots
    L_b..L_b+q-1 and returns the slots [0, max_b L_b + q). Lengths live in the owner."""

    def lazy_initialization(self, key_states, value_states) -> None:
        raise RuntimeError("a BatchCache is filled from prefills (`BatchCache.load`), never lazily")

    def update(self, key_states, value_states, *args, **kwargs):
        b, h, q, d = key_states.shape
        slots = self.owner.slots(q)                                        # (B, q)
        self.keys.scatter_(2, slots.view(b, 1, q, 1).expand(b, h, q, d), key_states)
        self.values.scatter_(2, slots.view(b, 1, q, 1).expand(b, h, q, value_states.shape[-1]), value_states)
        end = self.owner.max_length + q
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.max_length + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.max_length

    def get_max_length(self) -> int:
        return self.owner.capacity


class BatchCache(Cache):
    """One `BatchLayer` per decoder layer and per-sequence lengths: `lengths` (B,) on device,
    `length_list` the same as ints. Rollback of sequence b = `set_lengths`."""

    def __init__(self, num_layers: int, capacity: int, lengths: list[int], device):
        self.capacity = capacity
        super().__init__(layers=[BatchLayer(self) for _ in range(num_layers)])
        self.set_lengths(lengths, device)

    def set_lengths(self, lengths: list[int], device=None) -> None:
        self.length_list = list(lengths)
        self.lengths = torch.tensor(self.length_list, dtype=torch.long, device=device or self.lengths.device)
        self.max_length = max(self.length_list)

    def slots(self, q: int) -> torch.Tensor:
        """(B, q): where the q new positions of each sequence go."""
        return self.lengths.view(-1, 1) + torch.arange(q, device=self.lengths.device)

    def load(self, prefills: list) -> None:
        """Slots [0, n_b) of row b <- the prompt cache of prefill b ((1, Hkv, >= n_b, D) per layer). A
        batch of one whose prefill is its own (`exclusive`) and has room decodes in that prefill's
        buffers, without a copy."""
        if len(prefills) == 1 and prefills[0].exclusive and prefills[0].cache.layers[0].capacity >= self.capacity:
            for layer, own in zip(self.layers, prefills[0].cache.layers):
                layer.keys, layer.values, layer.is_initialized = own.keys, own.values, True
            return
        for i, layer in enumerate(self.layers):
            first = prefills[0].cache.layers[i]
            b, (_, h, _, d) = len(prefills), first.keys.shape
            layer.keys = first.keys.new_zeros(b, h, self.capacity, d)
            layer.values = first.values.new_zeros(b, h, self.capacity, first.values.shape[-1])
            for row, p in enumerate(prefills):
                n = p.prompt.numel()
                layer.keys[row, :, :n] = p.cache.layers[i].keys[0, :, :n]
                layer.values[row, :, :n] = p.cache.layers[i].values[0, :, :n]
            layer.is_initialized = True

    def keep(self, rows: list[int]) -> None:
        """Only sequences `rows` stay (finished ones leave): one copy of the remaining rows."""
        index = torch.tensor(rows, dtype=torch.long, device=self.lengths.device)
        for layer in self.layers:
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        self.set_lengths([self.length_list[r] for r in rows])


def verify_mask(lengths: torch.Tensor, q: int, n: int, window: int | None) -> torch.Tensor:
    """(B, 1, q, n) bool: key slot j visible to query i of sequence b (at position L_b + i)."""
    qpos = (lengths.view(-1, 1) + torch.arange(q, device=lengths.device)).unsqueeze(-1)   # (B, q, 1)
    j = torch.arange(n, device=lengths.device)                                          # (n,)
    visible = j <= qpos
    if window is not None:
        visible &= j > qpos - window
    return visible.unsqueeze(1)


class BatchVerifyHook:
    """Verification over a `BatchCache`: explicit packed-GQA attention with the per-sequence mask;
    `observers[b]` (or None) sees sequence b's probabilities (1, Hkv, G, q, L_b + q), exactly the
    shape it sees when that sequence decodes alone. One query per sequence, every sequence of the
    same length and no observer (an AR step: the `ar` method's and every k = 0 round's) needs no mask:
    `one_query_attention` over the window's keys, by the path `ar_attention`."""

    def __init__(self, cache: BatchCache, windows: list, observers: list, ar_attention: str = DEFAULT_AR_ATTENTION):
        self.cache, self.windows, self.observers, self.ar_attention = cache, windows, observers, ar_attention
        self.unmasked = min(cache.length_list) == cache.max_length and all(o is None for o in observers)
        self.masks: dict = {}

    def __call__(self, module, query, key, value, attention_mask, scaling, **kwargs):
        q, n = query.shape[2], key.shape[2]
        window = self.windows[module.layer_idx]
        if q == 1 and self.unmasked:                  # query at position n - 1 sees [n - window, n)
            if window is not None and n > window:
                key, value = key[:, :, -window:], value[:, :, -window:]
            return one_query_attention(self.ar_attention, module, query, key, value, scaling, **kwargs), None
        if (window, q, n) not in self.masks:
            self.masks[(window, q, n)] = verify_mask(self.cache.lengths, q, n, window)
        probs = grouped_attention_probs(query, key, self.masks[(window, q, n)], scaling)   # (B, Hkv, G, q, N)
        for b, observe in enumerate(self.observers):
            if observe is not None:
                observe(module.layer_idx, probs[b:b + 1, ..., :self.cache.length_list[b] + q])
        return apply_probs(probs, value, query.dtype), None


# --- the batched sparse-KV draft ------------------------------------------------------------

class BatchDraftLayer(OwnedLayer):
    """(B, Hkv, S, D) draft buffers: the gathered positions in slots [0, M) (padded per sequence,
    `positions` -1 where empty), then one slot per draft step. `positions` (B, Hkv, S) holds each
    slot's absolute position. The draft step's query position lives in the owner.

    Two shapes, one layer: by default S = M + steps, reallocated when M changes, and `update` returns
    the filled slots; with the owner's fixed `capacity`, S = capacity for every round, the buffers
    keep their addresses, the fill count is a device tensor and `update` returns the whole buffer,
    so a draft step has one shape end to end (what `torch.compile` and CUDA graphs capture)."""

    def load(self, keys, values, positions) -> None:
        """keys/values (B, Hkv, M, D) at absolute `positions` (B, Hkv, M), -1 = padding."""
        b, h, m, d = keys.shape
        capacity = self.owner.capacity
        if capacity is None:
            slots = m + self.owner.steps
            if not self.is_initialized or self.keys.shape != (b, h, slots, d):   # else last round's buffers
                self.allocate(keys, values, positions, slots)
            self.fill = m
        else:
            if m + self.owner.steps > capacity:
                raise RuntimeError(f"draft cache overflow: {m} positions + {self.owner.steps} steps > capacity {capacity}")
            if not self.is_initialized or self.keys.shape[0] != b:
                self.allocate(keys, values, positions, capacity)
                self.fill = torch.zeros(1, dtype=torch.long, device=keys.device)
                for t in (self.keys, self.values, self.positions, self.fill):
                    torch._dynamo.mark_static_address(t)       # fixed addresses: CUDA graphs replay over them
            self.positions[:, :, m:].fill_(-1)
            self.fill.fill_(m)
        self.keys[:, :, :m].copy_(keys)
        self.values[:, :, :m].copy_(values)
        self.positions[:, :, :m].copy_(positions)
        self.is_initialized = True

    def allocate(self, keys, values, positions, slots: int) -> None:
        b, h, _, d = keys.shape
        self.keys = keys.new_zeros(b, h, slots, d)
        self.values = values.new_zeros(b, h, slots, values.shape[-1])
        self.positions = positions.new_full((b, h, slots), -1)

    def update(self, key_states, value_states, *args, **kwargs):
        qpos = self.owner.query_position.view(-1, 1, 1).expand(-1, self.positions.shape[1], 1)   # (B, Hkv, 1)
        if self.owner.capacity is not None:                                 # one draft token per step
            self.keys.index_copy_(2, self.fill, key_states)
            self.values.index_copy_(2, self.fill, value_states)
            self.positions.index_copy_(2, self.fill, qpos)
            self.fill.add_(1)
            return self.keys, self.values
        f = self.fill
        self.keys[:, :, f] = key_states[:, :, 0]
        self.values[:, :, f] = value_states[:, :, 0]
        self.positions[:, :, f] = qpos[:, :, 0]
        self.fill = f + 1
        return self.keys[:, :, :f + 1], self.values[:, :, :f + 1]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.capacity if self.owner.capacity is not None else self.fill

    def get_max_length(self) -> int:
        return self.keys.shape[2]

    def lazy_initialization(self, key_states, value_states) -> None:
        raise RuntimeError("a batch draft cache is filled by `load` before each round")


class BatchDraftCache(Cache):
    """One `BatchDraftLayer` per layer; `query_position` (B, 1) is each sequence's draft position.
    `capacity`: None, slots sized to each round; or a fixed slot count (the fixed-shape mode)."""

    def __init__(self, num_layers: int, steps: int, capacity: int | None = None):
        self.steps, self.capacity = steps, capacity
        self.query_position = None
        super().__init__(layers=[BatchDraftLayer(self) for _ in range(num_layers)])


class BatchDraftHook:
    """Draft attention: each sequence's query sees its own filled slots at positions <= its own,
    inside a sliding window where the layer has one; packed-GQA SDPA with a (B, Hkv, 1, S) mask
    built from tensors only (so the fixed-shape mode has fixed shapes end to end)."""

    def __init__(self, cache: BatchDraftCache, windows: list):
        self.cache, self.windows = cache, windows

    def __call__(self, module, query, key, value, attention_mask, scaling, **kwargs):
        positions = self.cache.layers[module.layer_idx].positions[:, :, :key.shape[2]]   # (B, Hkv, S)
        qpos = self.cache.query_position.view(-1, 1, 1)
        visible = (positions >= 0) & (positions <= qpos)
        window = self.windows[module.layer_idx]
        if window is not None:
            visible &= positions > qpos - window
        return grouped_sdpa(query, key, value, scaling, visible.unsqueeze(2)), None
