"""Plain autoregressive decoding: the drafter that proposes nothing.

Every round verifies just the newest token, i.e. one ordinary decode step on the same cache as the
speculative methods, attending by the path the caller chose (`ar_attention`: packed-GQA by default;
the harness measures every path and takes the fastest). It is the baseline of every speed-up, and
every k = 0 round of the other methods is this very step."""
from __future__ import annotations

from sparsespec.methods.base import Drafter


class AutoregressiveDrafter(Drafter):
    name = "ar"
    drafts = False
    batchable = True

    def batch_proposer(self, windows: list):
        return None    # proposes nothing
