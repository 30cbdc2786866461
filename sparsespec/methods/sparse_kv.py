"""Self-speculation over a sparse subset of the KV cache, chosen by a KV-selection policy.

The target model drafts with every layer, but each layer's attention sees only the positions a
policy (`sparsespec/methods/policies/`) selects per KV head: sinks + recent + a top-K share. Two
drafters run every policy; which one follows from the policy's base class:

- `GatheredKVDrafter` (a `KVPolicy`): the policy selects once per round; the positions are gathered
  into a small draft cache (the batch's padded one, in its fixed-shape mode for compilation). Draft
  tokens' K/V go to the draft cache only; the full cache is untouched until verification.
- `QueryAwareKVDrafter` (a `QueryAwarePolicy`: oracle, Quest): the policy selects at every draft
  step from the draft query; steps run over the full cache and are rolled back before verification.
  It drafts one sequence at a time (a batch of one).

Both hand the policy's observers to the loop's hooks: a prefill observer to the prefill's
`ObservedPrefillHook`, a verification observer to the loop's verification hook.
"""
from __future__ import annotations

from typing import ClassVar

import torch

from sparsespec.engine.attention import QueryAwareDraftHook
from sparsespec.engine.batch_cache import BatchCache, BatchDraftCache, BatchDraftHook
from sparsespec.engine.cache import num_decoder_layers
from sparsespec.engine.selection import gather_positions, select_topk_batch, sliding_window_of, window_start
from sparsespec.engine.proposers import BatchModelProposer, DecodeState
from sparsespec.methods.base import ModelDrafter
from sparsespec.methods.policies import KVPolicy, QueryAwarePolicy
from sparsespec.methods.policies.base import DraftCacheOptions


class SparseKVDrafter(ModelDrafter):
    """Drafts with the target over the positions `policy_class` selects; see the module docstring."""
    policy_class: ClassVar[type[KVPolicy]]

    @staticmethod
    def for_policy(policy: type[KVPolicy]) -> type["SparseKVDrafter"]:
        """The method `policy.name`: a drafter class running `policy`, with the policy's options."""
        base = QueryAwareKVDrafter if issubclass(policy, QueryAwarePolicy) else GatheredKVDrafter
        return type(f"{policy.__name__}Drafter", (base,), {
            "name": policy.name, "Options": policy.Options, "default_controller": policy.default_controller,
            "policy_class": policy, "__doc__": policy.__doc__, "__module__": policy.__module__})

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        policy_options = {k: v for k, v in self.opts.as_dict().items() if k not in DraftCacheOptions.names()}
        self.use_draft_weights(getattr(self.opts, "draft_weights", "full"))
        self.policy = self.policy_class(model, prompt_len=self.prompt_len,
                                        max_length=self.prompt_len + kw["max_new_tokens"], **policy_options)
        self.budget = self.policy.budget
        if self.policy.budget_note:
            self.resolved_options.update(dense_draft=True, budget_note=self.policy.budget_note)
        self.windows = [sliding_window_of(model, i) for i in range(num_decoder_layers(model))]

    # --- the policy's observations ------------------------------------------------------------
    def prefill_observers(self) -> list:
        observer = self.policy.prefill_observer()
        return [] if observer is None else [observer]

    def prefill_query_rows(self) -> int | None:
        return self.policy.prefill_query_rows()

    def after_prefill(self, state: DecodeState) -> None:
        self.policy.after_prefill(state)

    def verify_observer(self):
        return self.policy.verification_observer()

    def after_verify(self, state, accepted, submitted) -> None:
        self.policy.after_verify(state, accepted)


class GatheredKVDrafter(SparseKVDrafter):
    """Selects once per round and drafts over a gathered draft cache (`GatheredProposer`): the
    batch's, padded per sequence; with `static_draft`/`compile_draft` its fixed-shape mode (one
    sequence at a time: a finished sequence would change the batch's shape)."""
    batchable = True

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        compile_draft = self.opts.compile_draft
        self.draft_dtype = next(self.drafting_model.parameters()).dtype
        self.static = self.opts.static_draft or bool(compile_draft)
        self.batchable = not self.static
        self.step_model = self.drafting_model
        if compile_draft:   # CUDA graphs need the fixed addresses the fixed-shape cache marks
            backend = "inductor" if compile_draft is True else compile_draft
            mode = "reduce-overhead" if model.device.type == "cuda" and backend == "inductor" else None
            self.step_model = torch.compile(self.drafting_model, dynamic=False, backend=backend, mode=mode)
        self.resolved_options.update(static_draft=self.static)

    def batch_proposer(self, windows: list):
        # fixed shape: M gathered positions + the round's draft tokens (+1 discarded step)
        capacity = self.budget.total + self.max_k + 2 if self.static else None
        return GatheredProposer(self.step_model, self.draft_dtype, windows, self.max_k, capacity)


class GatheredProposer(BatchModelProposer):
    """A gathered sparse-KV draft for a batch: each sequence's own policy selects its positions,
    gathered into one padded draft cache (of a fixed `capacity` of slots, or sized each round)."""

    def __init__(self, model, dtype: torch.dtype, windows: list, max_k: int, capacity: int | None = None):
        self.model, self.dtype, self.windows = model, dtype, windows
        self.cache = BatchDraftCache(len(windows), steps=max_k + 2, capacity=capacity)
        self.hook = BatchDraftHook(self.cache, windows)

    def prepare(self, target: BatchCache, seqs: list) -> None:
        """The batch's positions (B, layers, Hkv, M) by one top-k over every sequence's scores for all
        the layers that share window starts (every layer, without sliding windows), then gathered per
        layer into the draft cache."""
        lengths = target.length_list
        policies = [s.drafter.policy for s in seqs]
        budgets = [p.budget for p in policies]
        for starts, layers in layers_by_window_start(self.windows, lengths).items():
            scores = [torch.stack([p.draft_scores(i) for i in layers]) for p in policies]   # (layers, Hkv, C)
            positions = select_topk_batch(scores, lengths, budgets, list(starts))       # (B, layers, Hkv, M)
            for j, i in enumerate(layers):
                full, draft = target.layers[i], self.cache.layers[i]
                keys, values = gather_positions(full.keys, full.values, positions[:, j])   # (B, Hkv, M, D)
                draft.load(keys.to(self.dtype), values.to(self.dtype), positions[:, j])

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens (B,) at absolute positions (B,) -> (B, V) next-token logits."""
        self.cache.query_position = positions.view(-1, 1)
        out = self.model(input_ids=tokens.view(-1, 1), position_ids=positions.view(-1, 1),
                         past_key_values=self.cache, use_cache=True, attn_hook=self.hook, logits_to_keep=1)
        return out.logits[:, -1]


def layers_by_window_start(windows: list, lengths: list[int]) -> dict[tuple, list[int]]:
    """Layer indices grouped by where each sequence's visible window starts in them
    (per-sequence starts -> layers): one group without sliding windows."""
    groups: dict[tuple, list[int]] = {}
    for i, window in enumerate(windows):
        groups.setdefault(tuple(window_start(window, n) for n in lengths), []).append(i)
    return groups


class QueryAwareKVDrafter(SparseKVDrafter):
    """Selects at every draft step from the draft query, over the full cache (rolled back after).
    Draft K/V are written into the target's full cache, so the policy offers no bfloat16 drafts."""

    def __init__(self, model, **options):
        super().__init__(model, **options)
        self.hook = None                      # built on the first round, over the loop's cache

    def prepare(self, state: DecodeState) -> None:
        if self.hook is None:
            self.hook = QueryAwareDraftHook(state.cache, self.policy.select_for_query, self.windows)
        self.hook.length = state.length

    def step(self, state: DecodeState, token, position) -> torch.Tensor:
        state.cache.set_lengths([position])                  # this step's K/V go to slot `position`
        out = self.drafting_model(input_ids=token, position_ids=torch.tensor([[position]], device=state.device),
                                  past_key_values=state.cache, use_cache=True, attn_hook=self.hook,
                                  logits_to_keep=1)
        return out.logits[0, -1]

    def finish(self, state: DecodeState) -> None:
        state.cache.set_lengths([state.length])                                       # the rollback
