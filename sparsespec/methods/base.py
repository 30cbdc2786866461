"""The contract every decoding method implements, and the state the shared decode loop keeps.

A method is a *drafter*: it proposes tokens, and the shared loop in `sparsespec/decode.py`
verifies them with one full forward pass, accepts, rolls the cache back and times everything.
Autoregressive decoding is the drafter that proposes nothing. To add a method, subclass
`Drafter` (or `ModelDrafter` when drafting runs a model step by step), declare its options once
as an `Options` dataclass (sparsespec/options.py: type, default, reason, check), and register it in
`sparsespec/methods/__init__.py`. A new way of choosing the sparse draft's KV positions is not a
drafter but a policy: `sparsespec/methods/policies/`.

A drafter that can propose for a batch of sequences at once sets `batchable` and returns its
proposer from `batch_proposer` (a `BatchModelProposer` when drafting runs a model step by step); the
batched loop (`sparsespec/batch.py`) talks to it only through that proposer, `verify_observer`
and `after_prefill`/`after_verify`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..batch_cache import BatchCache
from ..draft_weights import DRAFT_WEIGHTS, draft_model, resolve_draft_weights
from ..options import NoOptions, OptionSet
from ..sampling import Sampler, entropy


@dataclass
class DecodeState:
    """What the loop knows between rounds."""
    model: torch.nn.Module
    cache: BatchCache                 # the batch's full KV cache (a drafter run one sequence at a time: its only row)
    ids: torch.Tensor                 # (capacity,) prompt + generated tokens; ids[:length+1] are valid
    length: int                       # positions in the full cache; ids[length] is the newest token
    prompt_len: int
    sampler: Sampler
    max_new_tokens: int

    @property
    def device(self) -> torch.device:
        return self.ids.device

    @property
    def last(self) -> torch.Tensor:
        """(1, 1) the newest token: chosen, but not yet in the cache."""
        return self.ids[self.length:self.length + 1].view(1, 1)

    def history(self) -> torch.Tensor:
        """(length + 1,) every token so far, the newest included."""
        return self.ids[:self.length + 1]


@dataclass
class BatchDraft:
    tokens: list[torch.Tensor] = field(default_factory=list)     # per step, (B,) token ids
    probs: list[torch.Tensor] = field(default_factory=list)      # per step, (B, V) draft distributions; empty: one-hot
    entropies: list[list[float]] = field(default_factory=list)   # per step, one entropy (nats) per sequence
    steps: int = 0                                               # draft forwards run


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
        """Draft with `kind` weights (sparsespec/draft_weights.py): sets `drafting_model` and records
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


def pick_rows(sampler: Sampler, logits: torch.Tensor):
    """One token per row of (B, V) logits: (B,) tokens and (B, V) distributions (None when greedy).
    Each row is drawn by `sampler.draw` on its own (V,) distribution, as a sequence alone is."""
    if sampler.greedy:
        return logits.argmax(dim=-1), None
    probs = sampler.probs(logits)
    return torch.stack([sampler.draw(p) for p in probs]), probs


class BatchModelProposer:
    """Drafts for a batch by running a model one token per step: `prepare` once per round, then
    `step(tokens (B,), positions (B,)) -> (B, V)` until the controller stops, then `finish`.
    `seqs`: the batch's active sequences in row order, each with its `drafter` and `state`."""

    def prepare(self, target: BatchCache, seqs: list) -> None:
        pass

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def finish(self, target: BatchCache) -> None:
        pass

    def draft(self, target: BatchCache, seqs: list, last: torch.Tensor, controller, sampler: Sampler,
              timers) -> BatchDraft:
        """`last` (B,): each sequence's newest token, at position L_b."""
        out = BatchDraft()
        with timers.select:
            self.prepare(target, seqs)
        with timers.draft:
            token, position = last, target.lengths.clone()
            while True:
                logits = self.step(token, position)                                   # (B, V)
                out.steps += 1
                token, probs = pick_rows(sampler, logits)                             # (B,), (B, V) | None
                out.tokens.append(token)
                out.entropies.append(entropy(logits).tolist())                        # one sync per step
                if probs is not None:
                    out.probs.append(probs)
                if not controller.keep_drafting_batch([list(col) for col in zip(*out.entropies)]):
                    break
                position = position + 1
            self.finish(target)
        return out


class OneSequenceProposer(BatchModelProposer):
    """The proposer of a drafter that drafts one sequence at a time (not `batchable`): the loop gives
    it batches of one, and each step is the drafter's own `step`."""

    def __init__(self, drafter: ModelDrafter):
        self.drafter, self.state = drafter, None

    def prepare(self, target: BatchCache, seqs: list) -> None:
        (self.state,) = (s.state for s in seqs)                                     # a batch of one
        self.drafter.prepare(self.state)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.drafter.step(self.state, tokens.view(1, 1), int(positions[0])).view(1, -1)   # (1, V)

    def finish(self, target: BatchCache) -> None:
        self.drafter.finish(self.state)
