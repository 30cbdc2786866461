"""The KV-selection policy interface, and the registry every policy joins by naming itself.

A sparse self-speculative draft attends, per layer and KV head, to the sinks, the recent window and
a top-K share of the cache chosen by a policy. A policy decides three things:

1. what to observe: `prefill_observer()` sees each layer's prompt (query, key) once, observe-only,
   from the one prefill forward, and reads the last `prefill_query_rows()` queries of it (a kept
   prefill replays just those); `verification_observer()` sees each verification's attention
   probabilities (B, Hkv, G, q, N). Either may be None, and then that pass costs nothing extra;
2. how to turn that into per-(layer, KV head) scores: `scores(layer)` (Hkv, >= length), kept up
   to date in `after_prefill` / `after_verify` (the cache has grown or rolled back by then);
3. which positions the draft attends to: once per round, the batch's top-K share by one top-k over
   every sequence's `draft_scores(layer)` (`selection.select_topk_batch`; gathered into a small draft
   cache), or, for a `QueryAwarePolicy`, `select_for_query(...)` at every draft step from the draft
   query itself.

The sinks, the recent window, the budget and its dense fallback are shared (`sparsespec/engine/selection.py`):
a policy only fills the top-K share. Options are declared once in `Options` (a dataclass of
`option(default, reason, check)` fields, sparsespec/options.py), checked before any model loads. `sparsespec/methods/sparse_kv.py` runs a policy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch

from sparsespec.engine.cache import num_decoder_layers
from sparsespec.engine.draft_weights import DRAFT_WEIGHTS
from sparsespec.options import OptionSet, above, at_least, one_of, option
from sparsespec.engine.selection import Budget, resolve_budget

# (layer_idx, query (B, H, q, D), key (B, Hkv, N, D), visible bool (B|1, 1, q, N) or None, scaling)
PrefillObserver = Callable[[int, torch.Tensor, torch.Tensor, "torch.Tensor | None", float], None]
# (layer_idx, probs (B, Hkv, G, q, N))
VerificationObserver = Callable[[int, torch.Tensor], None]

POLICIES: dict[str, type["KVPolicy"]] = {}

@dataclass(frozen=True)
class BudgetOptions(OptionSet):
    """The draft's budget, shared by every policy: sinks + recent + a top-K share."""
    sink: int = option(4, "StreamingLLM's attention sinks: the first few tokens soak up attention", check=at_least(0))
    recent: int = option(64, "the next token leans hardest on the last few dozen", check=at_least(0))
    topk: int | None = option(None, "null: what `budget` leaves after sinks and recent", check=at_least(0))
    budget: float = option(0.1, "~10% of the context was the paper's best drafting budget; a fraction < 1 of "
                                "the context or a token count >= 1 (more than the prompt: a dense draft)",
                           check=above(0, " (a fraction < 1 of the context, or a token count >= 1)"))

    def check_together(self) -> str | None:
        if self.sink == 0 and self.recent == 0 and self.topk == 0:
            return ("sink=0 recent=0 topk=0 leaves the draft no position to attend to; "
                    "give at least one of them a positive value")
        return None


def compile_backend(value) -> str | None:
    """compile_draft takes true/false, a torch.compile backend name, or a backend callable."""
    return None if isinstance(value, (bool, str)) or callable(value) else "true, false, a backend name or a callable"


@dataclass(frozen=True)
class DraftCacheOptions(OptionSet):
    """How a gathered draft runs: its weights and its cache's shape."""
    draft_weights: str = option("auto", "int8 draft copy on CPU (a step is weight-read bound), full on GPU",
                                check=one_of(*DRAFT_WEIGHTS))
    static_draft: bool = option(False, "fixed-shape draft cache + masked attention (what compile needs)")
    compile_draft: Any = option(False, "torch.compile the draft step (true: inductor, CUDA graphs on GPU; "
                                       "or a backend name or callable)", check=compile_backend)


@dataclass(frozen=True)
class GatheredOptions(DraftCacheOptions, BudgetOptions):
    """A policy that gathers its positions once per round: the budget and the draft cache's options."""


class KVPolicy:
    """Selects a draft's positions once per round; the base keeps sinks + recent only (no scores)."""
    name: ClassVar[str] = ""                   # method name; a subclass that sets it is registered
    Options: ClassVar[type[OptionSet]] = GatheredOptions   # the method's options, declared once
    default_controller: ClassVar[str] = "fixed"

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):
            if cls.name in POLICIES:
                raise TypeError(f"KV policy name {cls.name!r} is taken by {POLICIES[cls.name].__qualname__}")
            POLICIES[cls.name] = cls

    def __init__(self, model, *, prompt_len: int, max_length: int, sink: int = 0, recent: int = 0,
                 topk: int | None = None, budget: float | int = 1):
        config = model.config.get_text_config()
        self.num_layers = num_decoder_layers(model)
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.no_scores = torch.zeros(kv_heads, 1, device=model.device)    # top-K share of 0 reads nothing
        self.budget, self.budget_note = self.resolve_budget(prompt_len, max_length, sink=sink, recent=recent,
                                                            topk=topk, budget=budget)

    def resolve_budget(self, prompt_len, max_length, **budget_options) -> tuple[Budget, str | None]:
        return resolve_budget(prompt_len, max_length, **budget_options)

    # --- 1. observe ---------------------------------------------------------------------------
    def prefill_observer(self) -> PrefillObserver | None:
        return None

    def prefill_query_rows(self) -> int | None:
        """How many of the prompt's last queries `prefill_observer()` reads (None: possibly all)."""
        return 0 if self.prefill_observer() is None else None

    def verification_observer(self) -> VerificationObserver | None:
        return None

    def after_prefill(self, state) -> None:
        """The cache holds the prompt (`state.length` positions); prefill observations are in."""

    def after_verify(self, state, accepted: int) -> None:
        """The cache was rolled back to `state.length`; `accepted` drafts were kept (queries
        [0, accepted] of the verification belong to the sequence, the rest were rejected)."""

    # --- 2. score -----------------------------------------------------------------------------
    def scores(self, layer: int) -> torch.Tensor | None:
        """(Hkv, >= length) importance of each cached position, or None (no top-K share)."""
        return None

    # --- 3. select ----------------------------------------------------------------------------
    def draft_scores(self, layer: int) -> torch.Tensor:
        """(Hkv, >= 1) what this round's top-K share ranks: `scores(layer)`, or zeros when there are
        none (the budget then has no top-K share to fill)."""
        scores = self.scores(layer)
        return self.no_scores if scores is None else scores


class QueryAwarePolicy(KVPolicy):
    """Selects at every draft step, from the draft query itself (`select_for_query`); the draft
    runs over the full cache (`QueryAwareDraftHook`), so a step costs more than a gathered one."""

    def select_for_query(self, layer: int, query: torch.Tensor, key: torch.Tensor, visible: torch.Tensor | None,
                         scaling: float, length: int, window_start: int) -> torch.Tensor:
        """(Hkv, M) committed positions in [window_start, length) for this draft query
        (1, H, 1, D); `key` (1, Hkv, N, D) is the full cache including this round's drafts."""
        raise NotImplementedError
