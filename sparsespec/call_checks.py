"""Checks of what a caller hands `generate` beyond the prompt and the method: the seed, and the one
warning for a prompt that runs past the model's positions."""
from __future__ import annotations

import warnings
import weakref

from sparsespec.errors import ConfigError
from sparsespec.options import accepts

# Models already warned about running past their positions: the warning is said once per model,
# not once per prompt (a long-context sweep would repeat it on every prompt).
_WARNED = weakref.WeakSet()


class PastPositionsWarning(UserWarning):
    """A prompt plus its new tokens is longer than the model's max_position_embeddings."""


def check_seed(seed) -> None:
    """`seed` is None (no generator of its own) or an integer, as torch.Generator.manual_seed takes it."""
    if seed is not None and not accepts(int, seed):
        raise ConfigError(f"seed={seed!r} must be an integer or None")


def warn_past_positions(model, prompt_tokens: int, max_new_tokens: int) -> None:
    """Warn once per model when `prompt_tokens + max_new_tokens` runs past its max_position_embeddings:
    decoding still runs (RoPE extrapolates), but the model was never trained that long."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is None or not accepts(int, max_new_tokens) or prompt_tokens + max_new_tokens <= limit or model in _WARNED:
        return
    _WARNED.add(model)
    warnings.warn(f"a prompt of {prompt_tokens} tokens + max_new_tokens={max_new_tokens} runs past the model's "
                  f"max_position_embeddings={limit}; RoPE extrapolates, so the output is not meaningful "
                  f"(said once per model)", PastPositionsWarning, stacklevel=3)
