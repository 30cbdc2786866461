"""LayerSkip-style self-speculation: draft with the first `exit_layer` layers plus the final norm
and LM head (early exit), verify with the whole model.

The early layers' outputs do not depend on later layers, so the K/V that drafting writes into
layers < exit_layer are exactly the target's for those tokens. This implementation still rolls them
back and lets verification recompute every layer (simple and obviously lossless); skipping that
recomputation needs a per-layer forward that transformers does not expose. Models not trained for
early exit (every model here) accept few drafts: that is the honest baseline, not a bug.

Early exit uses the mechanism of transformers' own `assistant_early_exit`: the decoder runs
`layers[:config.num_hidden_layers]`, so the config value is lowered for the draft steps only."""
from __future__ import annotations

from contextlib import contextmanager

import torch

from ..cache import num_decoder_layers
from ..errors import ConfigError
from .base import DecodeState, ModelDrafter


@contextmanager
def early_exit(model, n_layers: int):
    config = model.config.get_text_config()
    full = config.num_hidden_layers
    config.num_hidden_layers = n_layers
    try:
        yield
    finally:
        config.num_hidden_layers = full


class LayerSkipDrafter(ModelDrafter):
    name = "layerskip"
    # draft_weights: as sparsespec's, so both draft on the same weights; bf16 is not offered, since
    # early-exit drafts write their K/V into the target's (fp32) full cache
    OPTIONS = {
        "exit_layer": None,        # None: half the layers, the usual LayerSkip operating point
        "draft_weights": "auto",   # int8 draft copy on CPU, the target's own weights on GPU
    }

    def __init__(self, model, *, prompt_len, max_new_tokens, max_k, exit_layer, draft_weights):
        super().__init__(model, prompt_len=prompt_len, max_new_tokens=max_new_tokens, max_k=max_k)
        self.use_draft_weights(draft_weights, allowed=("auto", "full", "int8"))
        n = num_decoder_layers(model)
        self.exit_layer = n // 2 if exit_layer is None else exit_layer
        if not isinstance(self.exit_layer, int) or not 1 <= self.exit_layer < n:
            raise ConfigError(f"exit_layer={exit_layer!r} must be an integer in [1, {n - 1}] for this {n}-layer model")

    def step(self, state: DecodeState, token, position) -> torch.Tensor:
        with early_exit(self.drafting_model, self.exit_layer):
            out = self.drafting_model(input_ids=token, position_ids=torch.tensor([[position]], device=state.device),
                             past_key_values=state.cache, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1]

    def finish(self, state: DecodeState) -> None:
        state.cache.truncate(state.length)
