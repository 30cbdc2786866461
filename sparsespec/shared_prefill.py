"""One prefill per prompt, shared by every method that decodes it.

The prompt runs through the full model once. Each method's drafter may observe that forward (its
`prefill_observers()`, e.g. SparseSpec-L's SnapKV-style observation window): the layer's SDPA output is
computed once (`attention.ObservedPrefillHook`) and each observer gets the layer's (layer_idx, query,
key, visible mask, scaling). What the forward leaves, `SharedPrefill`:

- the prompt's KV cache, which no method writes: each method decodes in its own copy of the
  prefix (`PreallocatedCache.copy_prefix`), unless it is the only consumer (`exclusive`);
- the next-token logits after the prompt, from which each method picks its first token with its
  own sampler (so sampled runs stay seeded per method);
- the wall time of the forward, reported as every method's prefill time.

`sparsespec.decode.prefill` builds the methods and runs this; `generate(..., prefilled=...)`
decodes from it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from .attention import ObservedPrefillHook
from .cache import PreallocatedCache, num_decoder_layers
from .timing import Stopwatch


@dataclass
class SharedPrefill:
    prompt: torch.Tensor              # (n,) the prompt's token ids
    cache: PreallocatedCache          # the prompt's K/V, n positions; never written after the forward
    logits: torch.Tensor              # (V,) the target's next-token logits after the prompt
    seconds: float                    # wall time of the one forward (synchronised on GPU)
    exclusive: bool = False           # one consumer: it decodes in `cache` itself, no copy

    def cache_for(self, capacity: int) -> PreallocatedCache:
        """The cache a method decodes in: a copy of the prompt's prefix with room for `capacity`
        positions (or the cache itself for an exclusive consumer)."""
        n = self.prompt.numel()
        if self.exclusive:
            if self.cache.layers[0].capacity < capacity:
                raise RuntimeError(f"exclusive prefill cache holds {self.cache.layers[0].capacity} positions, "
                                   f"the method needs {capacity}")
            return self.cache
        return self.cache.copy_prefix(n, capacity)


@dataclass
class Prefilled:
    """One method's start from a shared prefill: the forward's results, and the method's drafter and
    controller (built before the forward, so the drafter's policy could observe it)."""
    shared: SharedPrefill
    method: str
    options: dict                     # resolved: controller and drafter options
    drafter: object
    controller: object
    max_new_tokens: int
    used: bool = field(default=False)

    @property
    def capacity(self) -> int:
        """Positions the method's cache needs: prompt + output + one full round of drafts written
        by verification before the rollback."""
        return self.shared.prompt.numel() + self.max_new_tokens + self.controller.max_k + 2


def run_prefill(model, prompt: torch.Tensor, observers: list, capacity: int, exclusive: bool) -> SharedPrefill:
    """The prompt through the full model, once, with every observer: (SharedPrefill)."""
    cache = PreallocatedCache(num_decoder_layers(model), capacity)
    watch = Stopwatch(prompt.device)
    with watch:
        out = model(input_ids=prompt.view(1, -1), past_key_values=cache, use_cache=True,
                    attn_hook=ObservedPrefillHook(observers) if observers else None, logits_to_keep=1)
        logits = out.logits[0, -1]
    return SharedPrefill(prompt=prompt, cache=cache, logits=logits, seconds=watch.seconds, exclusive=exclusive)
