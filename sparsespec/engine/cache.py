"""A preallocated KV cache on transformers' cache interface: in-place writes, O(1) rollback.

transformers' `DynamicLayer.update` concatenates the whole buffer on every call (O(N) per layer per
step), and its `crop` slices. The prefill writes the prompt here (a batch of one then decodes in these
very buffers, sparsespec/engine/batch_cache.py), and the assisted draft model, which rolls back every round,
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
