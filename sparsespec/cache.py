"""A preallocated KV cache on transformers' cache interface: in-place writes, O(1) rollback.

transformers' `DynamicLayer.update` concatenates the whole buffer on every call (O(N) per layer per
step), and its `crop` slices. The prefill writes the prompt here (a batch of one then decodes in these
very buffers, sparsespec/batch_cache.py), and the assisted draft model, which rolls back every round,
keeps its own cache here.

Shapes: keys/values buffers are (B, Hkv, capacity, D); `update` returns views (B, Hkv, length, D).

Sliding-window layers (Mistral, Qwen2 `sliding_attention`) also keep every position here: the
layer reports itself as full (`is_sliding = False`, offset 0), so transformers builds the sliding
mask from *absolute* positions and attention is exactly what a windowed cache would give. Memory is
O(N) per layer either way for the full-attention layers, and the sparse draft needs old positions.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class PreallocatedLayer(CacheLayerMixin):
    is_sliding = False
    is_croppable = True
    is_compileable = False

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = key_states.new_empty(b, h, self.capacity, d)
        self.values = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache overflow: {end} positions > capacity {self.capacity}")
        self.keys[:, :, self.length:end] = key_states
        self.values[:, :, self.length:end] = value_states
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def crop(self, tokens_to_remove: int) -> None:
        # transformers 5.x convention: a negative count of tokens to drop.
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
        self.length = max(self.length + tokens_to_remove, 0)

    def truncate(self, length: int) -> None:
        """Roll back to `length` positions (O(1): the buffer is simply overwritten later)."""
        self.length = min(self.length, length)

    def reset(self) -> None:
        self.length = 0


class PreallocatedCache(Cache):
    """One `PreallocatedLayer` per decoder layer."""

    def __init__(self, num_layers: int, capacity: int):
        super().__init__(layers=[PreallocatedLayer(capacity) for _ in range(num_layers)])

    def truncate(self, length: int) -> None:
        for layer in self.layers:
            layer.truncate(length)


def num_decoder_layers(model) -> int:
    return model.config.get_text_config().num_hidden_layers


class StaticDraftLayer(CacheLayerMixin):
    """A draft cache layer whose shapes never change: what `torch.compile` / CUDA graphs capture.

    Buffers are (1, Hkv, capacity, D) with capacity = budget + max_k + 1. `load` puts the gathered
    positions in the first M slots; each draft step writes its K/V at slot `fill` (a device tensor,
    so no Python int changes between steps) and `update` returns the whole buffer. Which slots a
    query may see is carried by `positions` (Hkv, capacity): each slot's absolute position, -1 when
    empty; `StaticDraftHook` turns it into the attention mask.
    """
    is_sliding = False
    is_croppable = False
    is_compileable = True

    def __init__(self, capacity: int, owner: "StaticDraftCache"):
        super().__init__()
        self.capacity = capacity
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = key_states.new_zeros(b, h, self.capacity, d)
        self.values = value_states.new_zeros(b, h, self.capacity, value_states.shape[-1])
        self.positions = torch.full((h, self.capacity), -1, dtype=torch.long, device=self.device)
        self.fill = torch.zeros(1, dtype=torch.long, device=self.device)
        if hasattr(torch, "_dynamo"):     # fixed addresses, so CUDA graphs can replay over them
            for t in (self.keys, self.values, self.positions, self.fill):
                torch._dynamo.mark_static_address(t)
        self.is_initialized = True

    def load(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Slots [0, M) <- gathered (1, Hkv, M, D) K/V at absolute `positions` (Hkv, M); the rest empty."""
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        m = keys.shape[-2]
        if m >= self.capacity:
            raise RuntimeError(f"draft cache overflow: {m} positions >= capacity {self.capacity}")
        self.keys[:, :, :m].copy_(keys)
        self.values[:, :, :m].copy_(values)
        self.positions[:, :m].copy_(positions)
        self.positions[:, m:].fill_(-1)
        self.fill.fill_(m)

    def update(self, key_states, value_states, *args, **kwargs):
        # one draft token: write slot `fill` at the owner's current query position, then advance
        self.keys.index_copy_(2, self.fill, key_states)
        self.values.index_copy_(2, self.fill, value_states)
        self.positions.index_copy_(1, self.fill, self.owner.query_position.expand(self.positions.shape[0], 1))
        self.fill.add_(1)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.capacity, 0

    def get_seq_length(self) -> int:
        return self.capacity

    def get_max_length(self) -> int:
        return self.capacity


class StaticDraftCache(Cache):
    """One `StaticDraftLayer` per decoder layer; `query_position` (1, 1) is the drafted token's
    absolute position, set by the drafter before each step."""

    def __init__(self, num_layers: int, capacity: int, device=None):
        self.query_position = torch.zeros(1, 1, dtype=torch.long, device=device)
        super().__init__(layers=[StaticDraftLayer(capacity, self) for _ in range(num_layers)])
