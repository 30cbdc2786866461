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
from dataclasses import dataclass

import torch

from sparsespec.engine.batch_cache import BatchCache, BatchVerifyHook
from sparsespec.engine.cache import num_decoder_layers
from sparsespec.errors import ConfigError
from sparsespec.options import OptionSet, at_least, one_of, option
from sparsespec.engine.proposers import BatchModelProposer
from sparsespec.methods.base import ModelDrafter


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
    batchable = True

    @dataclass(frozen=True)
    class Options(OptionSet):
        exit_layer: int | None = option(None, "null: half the layers, the usual LayerSkip operating point",
                                        check=at_least(1))
        # bf16 is not offered: early-exit drafts write their K/V into the target's (fp32) full cache
        draft_weights: str = option("auto", "as sparsespec's, so both draft on the same weights (int8 on CPU)",
                                    check=one_of("auto", "full", "int8"))

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        self.use_draft_weights(self.opts.draft_weights, allowed=("auto", "full", "int8"))
        n = num_decoder_layers(model)
        self.exit_layer = n // 2 if self.opts.exit_layer is None else self.opts.exit_layer
        if not 1 <= self.exit_layer < n:
            raise ConfigError(f"exit_layer={self.exit_layer!r} must be an integer in [1, {n - 1}] for this {n}-layer model")

    def batch_proposer(self, windows: list) -> "EarlyExitProposer":
        return EarlyExitProposer(self.drafting_model, self.exit_layer, windows)


class EarlyExitProposer(BatchModelProposer):
    """LayerSkip for a batch: the first `exit_layer` layers draft over the target's own `BatchCache`
    (step s of sequence b writes slot L_b + s, attends with the verification mask); the lengths
    are restored afterwards, so verification overwrites those slots."""

    def __init__(self, model, exit_layer: int, windows: list):
        self.model, self.exit_layer, self.windows = model, exit_layer, windows
        self.target = self.lengths = None

    def prepare(self, target: BatchCache, seqs: list) -> None:
        self.target, self.lengths = target, list(target.length_list)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.target.set_lengths(positions.tolist())
        hook = BatchVerifyHook(self.target, self.windows, [None] * tokens.shape[0])
        with early_exit(self.model, self.exit_layer):
            out = self.model(input_ids=tokens.view(-1, 1), position_ids=positions.view(-1, 1),
                             past_key_values=self.target, use_cache=True, attn_hook=hook, logits_to_keep=1)
        return out.logits[:, -1]

    def finish(self, target: BatchCache) -> None:
        target.set_lengths(self.lengths)                                              # the rollback
