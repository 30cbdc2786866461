"""Classic speculative decoding with a separate, smaller draft model sharing the target's tokenizer
(e.g. Llama-3.2-1B-Instruct drafting for Llama-3-8B-Instruct).

The draft model keeps its own preallocated cache. After verification it is rolled back to the
accepted prefix; at the next round's first step it catches up on the tokens it has not seen (the
target's correction or bonus, and a fully accepted last draft) in one forward.

`draft_model` is a loaded model, a hub id or local path (loaded once per process and reused), or
"truncated:N": a model made of the target's own first N layers with their weights shared, for when
no smaller model of the family is available (it differs from `layerskip` by its separate cache).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from sparsespec.engine.cache import PreallocatedCache, num_decoder_layers
from sparsespec.errors import ConfigError
from sparsespec.options import OptionSet, option
from sparsespec.engine.proposers import DecodeState
from sparsespec.methods.base import ModelDrafter


def truncated_copy(model, n_layers: int):
    """A model running the target's first `n_layers` layers; parameters are shared, not copied."""
    n = num_decoder_layers(model)
    if not 1 <= n_layers < n:
        raise ConfigError(f"draft_model='truncated:{n_layers}' needs 1 <= N < {n} (the target's layers)")
    shallow = copy.copy(model)                       # new module object, same parameter tensors
    shallow._modules = dict(model._modules)
    inner = copy.copy(model.model)
    inner._modules = dict(model.model._modules)
    inner.layers = torch.nn.ModuleList(list(model.model.layers[:n_layers]))
    inner.config = copy.deepcopy(model.model.config)
    inner.config.num_hidden_layers = n_layers
    shallow.model = inner
    shallow.config = inner.config
    if hasattr(inner.config, "layer_types") and inner.config.layer_types is not None:
        inner.config.layer_types = inner.config.layer_types[:n_layers]
    return shallow


@lru_cache(maxsize=2)
def load_draft_model(path: str, dtype: torch.dtype, device: str):
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    except OSError as err:
        raise ConfigError(f"draft_model={path!r} could not be loaded ({err.__class__.__name__}); give a hub id "
                          f"available here, a local folder, or 'truncated:N'") from None


def resolve_draft_model(spec, target):
    if spec is None:
        raise ConfigError("method 'assisted' needs draft_model: a model, a hub id or local path, or 'truncated:N'")
    if isinstance(spec, torch.nn.Module):
        return spec
    if isinstance(spec, str) and spec.startswith("truncated:"):
        try:
            n = int(spec.split(":", 1)[1])
        except ValueError:
            raise ConfigError(f"draft_model={spec!r}: expected 'truncated:N' with an integer N") from None
        return truncated_copy(target, n)
    if isinstance(spec, str):
        param = next(target.parameters())
        return load_draft_model(spec, param.dtype, str(param.device))
    raise ConfigError(f"draft_model={spec!r} must be a model, a hub id or path, or 'truncated:N'")


class AssistedDrafter(ModelDrafter):
    name = "assisted"

    @dataclass(frozen=True)
    class Options(OptionSet):
        draft_model: Any = option(None, "required: a loaded model, a hub id or local path, or 'truncated:N'")

        def check_together(self) -> str | None:
            if self.draft_model is None:
                return "draft_model is required: a model, a hub id or local path, or 'truncated:N'"
            return None

    def __init__(self, model, *, prompt_len, max_new_tokens, max_k, options):
        super().__init__(model, prompt_len=prompt_len, max_new_tokens=max_new_tokens, max_k=max_k, options=options)
        self.draft_model = resolve_draft_model(self.opts.draft_model, model)
        self.vocab = model.config.get_text_config().vocab_size
        capacity = prompt_len + max_new_tokens + max_k + 2
        self.cache = PreallocatedCache(num_decoder_layers(self.draft_model), capacity)
        self.cache_len = 0             # positions of the sequence the draft cache holds

    def after_prefill(self, state: DecodeState) -> None:
        """The draft model reads the prompt too (counted as prefill)."""
        self.draft_model(input_ids=state.ids[:state.length].view(1, -1), past_key_values=self.cache,
                         use_cache=True, logits_to_keep=1)
        self.cache_len = state.length

    def step(self, state: DecodeState, token, position) -> torch.Tensor:
        start = self.cache_len if position == state.length else position   # catch up on round one
        inputs = state.ids[start:position + 1].view(1, -1) if start < position else token
        positions = torch.arange(start, position + 1, device=state.device).view(1, -1)
        logits = self.draft_model(input_ids=inputs, position_ids=positions, past_key_values=self.cache,
                                  use_cache=True, logits_to_keep=1).logits[0, -1]
        self.cache_len = position + 1
        return match_vocab(logits, self.vocab)

    def after_verify(self, state, accepted, submitted) -> None:
        # the draft cache holds [last, d_1, ...] from the old length on; [last, d_1..d_a] survived
        self.cache_len = min(self.cache_len, state.length)
        self.cache.truncate(self.cache_len)


def match_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Families pad their vocabularies differently: trim, or pad with -inf, to the target's size."""
    if logits.shape[-1] == vocab:
        return logits
    if logits.shape[-1] > vocab:
        return logits[..., :vocab]
    pad = logits.new_full((*logits.shape[:-1], vocab - logits.shape[-1]), float("-inf"))
    return torch.cat([logits, pad], dim=-1)
