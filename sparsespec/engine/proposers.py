"""What the decode loop keeps per sequence (`DecodeState`), what a round's draft is (`BatchDraft`), and
the proposer contract the loop drafts through: `BatchModelProposer` (prepare once a round, one step
a draft token for the whole batch, finish) and `OneSequenceProposer`, which runs a drafter that
drafts one sequence at a time as a batch of one. The drafters (sparsespec/methods/) build proposers;
the loop (loop.py) knows only this contract."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sparsespec.engine.batch_cache import BatchCache
from sparsespec.engine.sampling import Sampler, entropy


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
