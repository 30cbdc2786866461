"""Self-speculation over a sparse, gathered copy of the KV cache.

The target model drafts with every layer, but each layer's attention sees only M positions per KV
head (sinks + recent + top-K, `sparsespec/selection.py`), gathered into a small draft cache. Draft
tokens' own K/V go to the draft cache only; the full cache is untouched until verification.

Three policies differ only in where the top-K scores come from:
- `sparsespec` (SparseSpec-L): the attention probabilities of the previous verification pass,
  recorded in that same pass (no extra forward). Round one uses the prefill observation window.
- `snapkv_static`: the prefill observation window only, never refreshed.
- `streaming` (MagicDec-style StreamingLLM draft): no top-K; the budget goes to the recent window.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..attention import ObservationHook, RecordingHook, StaticDraftHook, attend_all
from ..cache import PreallocatedCache, StaticDraftCache, num_decoder_layers
from ..draft_weights import DRAFT_WEIGHTS
from ..errors import ConfigError
from ..options import OptionSet, above, at_least, in_range, one_of, option
from ..selection import Budget, gather_positions, select_topk_positions, sliding_window_of, window_start
from .base import DecodeState, ModelDrafter


def compile_backend(value) -> str | None:
    """compile_draft takes true/false, a torch.compile backend name, or a backend callable."""
    return None if isinstance(value, (bool, str)) or callable(value) else "true, false, a backend name or a callable"


def resolve_budget(prompt_len: int, *, sink: int, recent: int, topk: int | None, budget: float | int) -> Budget:
    """Budget from either an explicit `topk` or a total `budget` (a fraction < 1 of the prompt, or
    a token count >= 1) of which top-K gets what sinks and recent leave."""
    for name, value in (("sink", sink), ("recent", recent)):
        if not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name}={value!r} must be an integer >= 0")
    if topk is not None:
        if not isinstance(topk, int) or topk < 0:
            raise ConfigError(f"topk={topk!r} must be an integer >= 0 (or null to derive it from budget)")
        return Budget(sink, recent, topk)
    if not isinstance(budget, (int, float)) or budget <= 0:
        raise ConfigError(f"budget={budget!r} must be a fraction in (0, 1) of the context or a token count >= 1")
    total = round(budget * prompt_len) if budget < 1 else int(budget)
    if total < sink + recent:
        raise ConfigError(f"budget={budget!r} gives {total} tokens at context {prompt_len}, fewer than "
                          f"sink+recent={sink + recent}; raise budget or lower sink/recent")
    return Budget(sink, recent, total - sink - recent)


class SparseKVDrafter(ModelDrafter):
    name = "sparsespec"
    default_controller = "entropy"

    @dataclass(frozen=True)
    class Options(OptionSet):
        sink: int = option(4, "StreamingLLM's attention sinks: the first few tokens soak up attention", check=at_least(0))
        recent: int = option(64, "the next token leans hardest on the last few dozen", check=at_least(0))
        topk: int | None = option(None, "null: what `budget` leaves after sinks and recent", check=at_least(0))
        budget: float = option(0.1, "~10% of the context was the paper's best drafting budget; a fraction < 1 "
                                    "of the context, or a token count >= 1",
                                check=above(0, " (a fraction < 1 of the context, or a token count >= 1)"))
        obs_window: int = option(16, "prefill queries that seed round one (the paper recycles 16 queries)",
                                 check=at_least(1))
        score_decay: float = option(0.0, "0: scores of the last verification only; > 0: EMA over rounds",
                                    check=in_range(0, 1))
        draft_weights: str = option("auto", "int8 draft copy on CPU (a step is weight-read bound), full on GPU",
                                    check=one_of(*DRAFT_WEIGHTS))
        static_draft: bool = option(False, "fixed-shape draft cache + masked attention (what compile needs)")
        compile_draft: Any = option(False, "torch.compile the draft step (true: inductor, CUDA graphs on GPU; "
                                           "or a backend name or callable)", check=compile_backend)

    refresh_scores = True     # False: keep the prefill scores (snapkv_static)
    use_topk = True           # False: streaming (sinks + recent only)

    def __init__(self, model, **kw):
        super().__init__(model, **kw)
        o, max_k, prompt_len = self.opts, self.max_k, self.prompt_len
        sink, recent, topk = o.sink, getattr(o, "recent", 0), getattr(o, "topk", None)
        self.use_draft_weights(o.draft_weights)
        self.draft_dtype = next(self.drafting_model.parameters()).dtype
        if not self.use_topk:           # streaming: the whole budget beyond the sinks is recent
            total = resolve_budget(prompt_len, sink=sink, recent=0, topk=topk, budget=o.budget).total
            self.budget = Budget(sink, max(total - sink, 0), 0)
        else:
            self.budget = resolve_budget(prompt_len, sink=sink, recent=recent, topk=topk, budget=o.budget)
        self.obs_window = getattr(o, "obs_window", 1)
        self.score_decay = getattr(o, "score_decay", 0.0)
        self.records_attention = self.use_topk and self.refresh_scores and self.budget.topk > 0
        n_layers = num_decoder_layers(model)
        self.windows = [sliding_window_of(model, i) for i in range(n_layers)]
        # the draft cache holds M gathered positions + the round's draft tokens (+1 discarded step)
        compile_draft = o.compile_draft
        self.static = o.static_draft or bool(compile_draft)
        if self.static:
            self.draft_cache = StaticDraftCache(n_layers, self.budget.total + max_k + 2, device=model.device)
            self.draft_hook = StaticDraftHook(self.draft_cache)
        else:
            self.draft_cache = PreallocatedCache(n_layers, self.budget.total + max_k + 2)
            self.draft_hook = attend_all
        self.step_model = self.drafting_model
        if compile_draft:   # CUDA graphs need the fixed addresses the static cache marks
            backend = "inductor" if compile_draft is True else compile_draft
            mode = "reduce-overhead" if model.device.type == "cuda" and backend == "inductor" else None
            self.step_model = torch.compile(self.drafting_model, dynamic=False, backend=backend, mode=mode)
        self.resolved_options.update(static_draft=self.static)
        self.scores: list[torch.Tensor] | None = None     # per layer (Hkv, capacity)

    # --- scores -----------------------------------------------------------------------------
    def prefill_hook(self):
        return ObservationHook(self.obs_window) if self.use_topk and self.budget.topk > 0 else None

    def after_prefill(self, state: DecodeState, hook) -> None:
        if hook is None:
            return
        capacity = state.ids.shape[0]
        self.scores = [torch.zeros(s.shape[0], capacity, device=s.device, dtype=torch.float32)
                       for s in (hook.scores[i] for i in range(len(hook.scores)))]
        self._absorb(hook.scores)

    def _absorb(self, new_scores: dict[int, torch.Tensor]) -> None:
        for layer, new in new_scores.items():
            n = new.shape[-1]
            if self.score_decay:
                self.scores[layer][:, :n].mul_(self.score_decay).add_(new)
            else:
                self.scores[layer][:, :n].copy_(new)

    def verify_hook(self):
        return RecordingHook() if self.records_attention else super().verify_hook()

    def after_verify(self, state, hook, accepted, submitted) -> None:
        if isinstance(hook, RecordingHook):
            self._absorb(hook.scores)

    # --- drafting ---------------------------------------------------------------------------
    def prepare(self, state: DecodeState) -> None:
        """Select each layer's positions and gather them into the draft cache."""
        length = state.length
        for i, (full, draft) in enumerate(zip(state.cache.layers, self.draft_cache.layers)):
            start = window_start(self.windows[i], length)
            scores = self.scores[i] if self.scores is not None else full.keys.new_zeros(full.keys.shape[1], 1)
            positions = select_topk_positions(scores, length, self.budget, start)
            keys, values = gather_positions(full.keys, full.values, positions)
            if self.static:
                draft.load(keys.to(self.draft_dtype), values.to(self.draft_dtype), positions)
            else:
                draft.load(keys.to(self.draft_dtype), values.to(self.draft_dtype))

    def step(self, state, token, position) -> torch.Tensor:
        position_ids = torch.tensor([[position]], device=state.device)
        if self.static:
            self.draft_cache.query_position.copy_(position_ids)
        out = self.step_model(input_ids=token, position_ids=position_ids, past_key_values=self.draft_cache,
                              use_cache=True, attn_hook=self.draft_hook, logits_to_keep=1)
        return out.logits[0, -1]


class SnapKVStaticDrafter(SparseKVDrafter):
    name = "snapkv_static"
    default_controller = "fixed"
    refresh_scores = False


class StreamingDrafter(SparseKVDrafter):
    name = "streaming"
    default_controller = "fixed"
    use_topk = False
    Options = SparseKVDrafter.Options.subset("StreamingOptions", "sink", "budget", "draft_weights",
                                             "static_draft", "compile_draft")
