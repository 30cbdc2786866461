"""Plain autoregressive decoding: the drafter that proposes nothing.

Every round verifies just the newest token, i.e. one ordinary decode step on the same cache as the
speculative methods (transformers' SDPA, no mask, when the batch's sequences have one length). It is the baseline of every speed-up."""
from __future__ import annotations

from .base import Drafter


class AutoregressiveDrafter(Drafter):
    name = "ar"
    controllers = ("fixed",)
    drafts = False
    batchable = True

    def batch_proposer(self, windows: list):
        return None    # proposes nothing
