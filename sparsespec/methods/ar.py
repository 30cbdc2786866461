"""Plain autoregressive decoding: the drafter that proposes nothing.

Every round verifies just the newest token, i.e. one ordinary decode step on the same preallocated
cache and SDPA attention as the speculative methods. It is the baseline of every speed-up."""
from __future__ import annotations

from .base import Drafter


class AutoregressiveDrafter(Drafter):
    name = "ar"
    controllers = ("fixed",)
    drafts = False
    batchable = True

    def verify_hook(self):
        return None    # one query per step: transformers' SDPA, no mask (its fastest path)

    def batch_proposer(self, windows: list):
        return None    # proposes nothing
