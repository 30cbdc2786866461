"""The contract every decoding method implements, and the state the shared decode loop keeps.

A method is a *drafter*: it proposes tokens, and the shared loop in `sparsespec/api.py`
verifies them with one full forward pass, accepts, rolls the cache back and times everything.
Autoregressive decoding is the drafter that proposes nothing. To add a method, subclass
`Drafter` (or `ModelDrafter` when drafting runs a model step by step), declare its options once
as an `Options` dataclass (sparsespec/options.py: type, default, reason, check), and register it in
`sparsespec/methods/__init__.py`. A new way of choosing the sparse draft's KV positions is not a
drafter but a policy: `sparsespec/methods/policies/`.

A drafter that can propose for a batch of sequences at once sets `batchable` and returns its
proposer from `batch_proposer` (a `BatchModelProposer` when drafting runs a model step by step); the
batched loop (`sparsespec/engine/loop.py`) talks to it only through that proposer, `verify_observer`
and `after_prefill`/`after_verify`.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from sparsespec.engine.draft_weights import DRAFT_WEIGHTS, draft_model, resolve_draft_weights
from sparsespec.options import NoOptions, OptionSet
from sparsespec.engine.proposers import DecodeState, OneSequenceProposer


class Drafter:
    name: ClassVar[str] = ""
    batchable: ClassVar[bool] = False          # True: `batch_proposer` drafts for a whole batch at once
    Options: ClassVar[type[OptionSet]] = NoOptions   # declared once; checked by sparsespec/method_options.py
    drafts: ClassVar[bool] = True              # False only for AR: it proposes nothing, takes no controller options
    drafts_have_entropy: ClassVar[bool] = True # False: entropy-reading controllers do not apply (prompt lookup)
    default_controller: ClassVar[str] = "fixed"
    controller_defaults: ClassVar[dict] = {}   # this method's own defaults for controller options (pld: k=10)

    def __init__(self, model, *, prompt_len: int, max_new_tokens: int, max_k: int, options: OptionSet):
        self.model = model
        self.prompt_len = prompt_len
        self.max_k = max_k
        self.opts = options
        self.resolved_options: dict = {}       # options whose value depends on the model (e.g. "auto")

    # --- hooks the loop calls; defaults do nothing ------------------------------------------
    def prefill_observers(self) -> list:
        """Observers of the prefill forward, each called `(layer_idx, query, key, visible_or_None,
        scaling)` per layer; they compute statistics and never change the output."""
        return []

    def prefill_query_rows(self) -> int | None:
        """How many of the prompt's last queries the prefill observers read (0: no observers; None:
        possibly all). A kept prefill (`PrefillMemo`) keeps only that many, and replays them."""
        return 0 if not self.prefill_observers() else None

    def after_prefill(self, state: DecodeState) -> None:
        pass

    def verify_observer(self):
        """An observer of the verification's attention, `observe(layer_idx, probs)` with probs
        (1, Hkv, G, q, L + q), or None. It computes statistics and never changes the output."""
        return None

    def batch_proposer(self, windows: list):
        """The proposer of a batch of this method's sequences, or None when the method drafts
        nothing. It is built from the method's options (one method and options a batch) and reads
        each sequence's own state (its drafter's policy, its ids) through the `seqs` it is given
        each round. `windows`: each layer's sliding window or None. A drafter that is not
        `batchable` is given batches of one only."""
        raise NotImplementedError(f"method {self.name!r} does not propose for a batch")

    def after_verify(self, state: DecodeState, accepted: int, submitted: int) -> None:
        """Called once the full cache has been rolled back to `state.length`."""
        pass


class ModelDrafter(Drafter):
    """Drafts one token per forward of some model. A batchable subclass returns a `BatchModelProposer`
    of its own; the others draft one sequence at a time: they implement `prepare`, `step` and `finish`
    for one sequence, and `OneSequenceProposer` runs them as a batch of one."""

    default_controller = "fixed"

    def use_draft_weights(self, kind: str, allowed: tuple[str, ...] = DRAFT_WEIGHTS) -> None:
        """Draft with `kind` weights (sparsespec/engine/draft_weights.py): sets `drafting_model` and records
        the concrete choice ("auto" resolved) in `resolved_options`."""
        weights = resolve_draft_weights(self.model, kind, allowed)
        self.resolved_options["draft_weights"] = weights
        self.drafting_model = draft_model(self.model, weights)

    def prepare(self, state: DecodeState) -> None:
        """Per-round set-up before the first draft step (e.g. gather the draft KV)."""

    def step(self, state: DecodeState, token: torch.Tensor, position: int) -> torch.Tensor:
        """One draft forward of `token` (1, 1) at absolute `position` -> (V,) next-token logits."""
        raise NotImplementedError

    def finish(self, state: DecodeState) -> None:
        """After the last draft step (e.g. roll back what drafting wrote into the full cache)."""

    def batch_proposer(self, windows: list):
        return OneSequenceProposer(self)
