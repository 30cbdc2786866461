"""Batched decoding: B prompts of different lengths decoded together, lossless per sequence.

    prefill each prompt alone (B=1, the single-sequence prefill, its drafter observing it), or
        start from the prompts' shared prefills (`generate(prompts, prefilled=[...])`)
    copy the B prompt caches into one `BatchCache` (sequence b's position p at slot p)
    repeat while a sequence is unfinished:
        k      = the batch controller's draft length (one k for every sequence of the batch)
        drafts = (B, k): the sparse-KV draft over per-sequence, per-layer, per-KV-head positions
        verify [last_b, d_b1..d_bk] for every b in one forward, explicit attention, (B, 1, k+1, N) mask
        accept a_b per sequence (greedy or exact rejection sampling); L_b += a_b + 1 (the rollback)
        a finished sequence (EOS, max_new_tokens) leaves the batch: its rows are dropped, so it
        costs nothing after the round it finished in

Cache layout. Sequence b keeps position p at slot p; slots >= L_b are free (rejected drafts stay
there until overwritten). Positions are absolute, so RoPE sees what the sequence sees alone, and
the mask is explicit: key slot j is visible to query i of sequence b iff j <= L_b + i (and, on a
sliding-window layer, j > L_b + i - window). Rollback is setting L_b: O(1), no re-padding.

The batch's k (one per round, `Controller.keep_drafting_batch`): a fixed-k controller drafts its k;
the entropy controller maximises the expected tokens *over the batch* per unit of batch cost,
    R(k) = sum_b (1 + sum_{m<=k} pi^b_m) / (k C_d + C_v(k)),
with pi^b the survival of sequence b from its own draft entropies; C_d and C_v are the batched
step's measured costs. Each sequence's `Round` records its own accepted count and entropies; the
times in it are the batch's (shared by every sequence of that round).

Drafts: the gathered sparse-KV policies (sparsespec, streaming, snapkv_static, h2o) gather each
sequence's own per-layer, per-KV-head positions into one padded (B, Hkv, M, D) draft cache
(`BatchDrafter`); LayerSkip drafts with the first layers over the batch cache (`BatchEarlyExit`);
prompt lookup looks up per sequence (`BatchLookup`); AR drafts nothing. `batched_methods()` lists
them; any other method is a ConfigError, never a silent loop over sequences.

Sampling: one `Sampler` for the batch; each row is drawn on its own and each sequence runs exact
rejection sampling on its own drafts (`accept_sampling`), so each output keeps the model's
distribution (tests/test_batch.py enumerates the joint distribution of a batch of two).
"""
from __future__ import annotations

import time

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .attention import apply_probs, grouped_attention_probs, grouped_sdpa, sparsespec_attention
from .cache import num_decoder_layers
from .eos import through_eos
from .errors import ConfigError
from .generation import Generation, Round
from .logits import target_logits
from .method_options import build_method
from .methods import METHODS
from .methods.ar import AutoregressiveDrafter
from .methods.layerskip import LayerSkipDrafter, early_exit
from .methods.pld import PromptLookupDrafter, lookup_continuation
from .methods.base import DecodeState
from .methods.sparse_kv import GatheredKVDrafter
from .sampling import Sampler, accept_greedy, accept_sampling, entropy
from .selection import sliding_window_of, window_start
from .shared_prefill import run_prefill
from .timing import RoundTimers, Stopwatch, synchronize


def batched_methods() -> list[str]:
    return sorted(name for name, cls in METHODS.items()
                  if issubclass(cls, (AutoregressiveDrafter, GatheredKVDrafter, PromptLookupDrafter, LayerSkipDrafter)))


# --- input: a batch of prompts ----------------------------------------------------------------

def is_batch(input_ids, attention_mask) -> bool:
    """A list/tuple of prompts (tensors or lists: a flat list of ints is one prompt), a 2-D batch of
    more than one row, or any input with a mask."""
    if attention_mask is not None:
        return True
    if isinstance(input_ids, (list, tuple)):
        return bool(input_ids) and all(isinstance(p, (list, tuple)) or (isinstance(p, torch.Tensor) and p.dim() > 0)
                                       for p in input_ids)
    return isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.shape[0] > 1


def prompts_of(input_ids, attention_mask, as_prompt) -> list[torch.Tensor]:
    """A list of 1-D prompts, or padded (B, L) ids with a (B, L) mask (1 = token, 0 = pad, either
    side) -> B prompts, each checked by `as_prompt` (one (L_b,) long tensor)."""
    if isinstance(input_ids, (list, tuple)):
        if attention_mask is not None:
            raise ConfigError("attention_mask goes with padded (B, L) input_ids, not with a list of prompts")
        if not input_ids:
            raise ConfigError("input_ids is an empty list; pass at least one prompt")
        return [as_prompt(ids) for ids in input_ids]
    ids = torch.as_tensor(input_ids)
    if ids.dim() != 2:
        raise ConfigError(f"batched input_ids must be (B, L) with an attention_mask; got shape {tuple(ids.shape)}")
    if attention_mask is None:
        return [as_prompt(row) for row in ids]
    mask = torch.as_tensor(attention_mask)
    if mask.shape != ids.shape:
        raise ConfigError(f"attention_mask shape {tuple(mask.shape)} differs from input_ids shape {tuple(ids.shape)}")
    return [as_prompt(row[m.to(ids.device).bool()]) for row, m in zip(ids, mask)]


# --- the batch cache ----------------------------------------------------------------------------

class OwnedLayer(CacheLayerMixin):
    """A cache layer whose lengths and positions live in its owning cache (`owner`): never sliding
    (windows come from absolute positions in the masks), never cropped, not compiled."""
    is_sliding = False
    is_croppable = False
    is_compileable = False

    def __init__(self, owner):
        super().__init__()
        self.owner = owner


class BatchLayer(OwnedLayer):
    """(B, Hkv, capacity, D) buffers; `update` writes the q new K/V of sequence b at slots
    L_b..L_b+q-1 and returns the slots [0, max_b L_b + q). Lengths live in the owner."""

    def lazy_initialization(self, key_states, value_states) -> None:
        raise RuntimeError("a BatchCache is filled from prefills (`BatchCache.load`), never lazily")

    def update(self, key_states, value_states, *args, **kwargs):
        b, h, q, d = key_states.shape
        slots = self.owner.slots(q)                                        # (B, q)
        self.keys.scatter_(2, slots.view(b, 1, q, 1).expand(b, h, q, d), key_states)
        self.values.scatter_(2, slots.view(b, 1, q, 1).expand(b, h, q, value_states.shape[-1]), value_states)
        end = self.owner.max_length + q
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.max_length + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.max_length

    def get_max_length(self) -> int:
        return self.owner.capacity


class BatchCache(Cache):
    """One `BatchLayer` per decoder layer and per-sequence lengths: `lengths` (B,) on device,
    `length_list` the same as ints. Rollback of sequence b = `set_lengths`."""

    def __init__(self, num_layers: int, capacity: int, lengths: list[int], device):
        self.capacity = capacity
        super().__init__(layers=[BatchLayer(self) for _ in range(num_layers)])
        self.set_lengths(lengths, device)

    def set_lengths(self, lengths: list[int], device=None) -> None:
        self.length_list = list(lengths)
        self.lengths = torch.tensor(self.length_list, dtype=torch.long, device=device or self.lengths.device)
        self.max_length = max(self.length_list)

    def slots(self, q: int) -> torch.Tensor:
        """(B, q): where the q new positions of each sequence go."""
        return self.lengths.view(-1, 1) + torch.arange(q, device=self.lengths.device)

    def load(self, prefills: list) -> None:
        """Slots [0, n_b) of row b <- the prompt cache of prefill b ((1, Hkv, >= n_b, D) per layer)."""
        for i, layer in enumerate(self.layers):
            first = prefills[0].cache.layers[i]
            b, (_, h, _, d) = len(prefills), first.keys.shape
            layer.keys = first.keys.new_zeros(b, h, self.capacity, d)
            layer.values = first.values.new_zeros(b, h, self.capacity, first.values.shape[-1])
            for row, p in enumerate(prefills):
                n = p.prompt.numel()
                layer.keys[row, :, :n] = p.cache.layers[i].keys[0, :, :n]
                layer.values[row, :, :n] = p.cache.layers[i].values[0, :, :n]
            layer.is_initialized = True

    def keep(self, rows: list[int]) -> None:
        """Only sequences `rows` stay (finished ones leave): one copy of the remaining rows."""
        index = torch.tensor(rows, dtype=torch.long, device=self.lengths.device)
        for layer in self.layers:
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        self.set_lengths([self.length_list[r] for r in rows])


def verify_mask(lengths: torch.Tensor, q: int, n: int, window: int | None) -> torch.Tensor:
    """(B, 1, q, n) bool: key slot j visible to query i of sequence b (at position L_b + i)."""
    qpos = (lengths.view(-1, 1) + torch.arange(q, device=lengths.device)).unsqueeze(-1)   # (B, q, 1)
    j = torch.arange(n, device=lengths.device)                                          # (n,)
    visible = j <= qpos
    if window is not None:
        visible &= j > qpos - window
    return visible.unsqueeze(1)


class BatchVerifyHook:
    """Verification over a `BatchCache`: explicit packed-GQA attention with the per-sequence mask;
    `observers[b]` (or None) sees sequence b's probabilities (1, Hkv, G, q, L_b + q), exactly the
    shape it sees when that sequence decodes alone."""

    def __init__(self, cache: BatchCache, windows: list, observers: list):
        self.cache, self.windows, self.observers = cache, windows, observers
        self.masks: dict = {}

    def __call__(self, module, query, key, value, attention_mask, scaling, **kwargs):
        q, n = query.shape[2], key.shape[2]
        window = self.windows[module.layer_idx]
        if (window, q, n) not in self.masks:
            self.masks[(window, q, n)] = verify_mask(self.cache.lengths, q, n, window)
        probs = grouped_attention_probs(query, key, self.masks[(window, q, n)], scaling)   # (B, Hkv, G, q, N)
        for b, observe in enumerate(self.observers):
            if observe is not None:
                observe(module.layer_idx, probs[b:b + 1, ..., :self.cache.length_list[b] + q])
        return apply_probs(probs, value, query.dtype), None


# --- the batched sparse-KV draft ------------------------------------------------------------

class BatchDraftLayer(OwnedLayer):
    """(B, Hkv, S, D) draft buffers: the gathered positions in slots [0, M) (padded per sequence,
    `positions` -1 where empty), then one slot per draft step. `positions` (B, Hkv, S) holds each
    slot's absolute position. The draft step's query position lives in the owner."""

    def load(self, keys, values, positions) -> None:
        """keys/values (B, Hkv, M, D) at absolute `positions` (B, Hkv, M), -1 = padding."""
        b, h, m, d = keys.shape
        s = m + self.owner.steps
        self.keys = keys.new_zeros(b, h, s, d)
        self.values = values.new_zeros(b, h, s, values.shape[-1])
        self.positions = positions.new_full((b, h, s), -1)
        self.keys[:, :, :m], self.values[:, :, :m], self.positions[:, :, :m] = keys, values, positions
        self.fill = m
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        f = self.fill                                                      # one draft token per step
        self.keys[:, :, f] = key_states[:, :, 0]
        self.values[:, :, f] = value_states[:, :, 0]
        self.positions[:, :, f] = self.owner.query_position                # (B, 1) -> (B, Hkv)
        self.fill = f + 1
        return self.keys[:, :, :f + 1], self.values[:, :, :f + 1]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.fill + query_length, 0

    def get_seq_length(self) -> int:
        return self.fill

    def get_max_length(self) -> int:
        return self.keys.shape[2]

    def lazy_initialization(self, key_states, value_states) -> None:
        raise RuntimeError("a batch draft cache is filled by `load` before each round")


class BatchDraftCache(Cache):
    """One `BatchDraftLayer` per layer; `query_position` (B, 1) is each sequence's draft position."""

    def __init__(self, num_layers: int, steps: int):
        self.steps = steps
        self.query_position = None
        super().__init__(layers=[BatchDraftLayer(self) for _ in range(num_layers)])


class BatchDraftHook:
    """Draft attention: each sequence's query sees its own filled slots at positions <= its own,
    inside a sliding window where the layer has one; packed-GQA SDPA with a (B, Hkv, 1, S) mask."""

    def __init__(self, cache: BatchDraftCache, windows: list):
        self.cache, self.windows = cache, windows

    def __call__(self, module, query, key, value, attention_mask, scaling, **kwargs):
        positions = self.cache.layers[module.layer_idx].positions[:, :, :key.shape[2]]   # (B, Hkv, S)
        qpos = self.cache.query_position.view(-1, 1, 1)
        visible = (positions >= 0) & (positions <= qpos)
        window = self.windows[module.layer_idx]
        if window is not None:
            visible &= positions > qpos - window
        return grouped_sdpa(query, key, value, scaling, visible.unsqueeze(2)), None


def gather_batch(keys, values, positions):
    """keys/values (B, Hkv, C, D), positions (B, Hkv, M) (-1 = padding) -> (B, Hkv, M, D) each."""
    b, h, c, d = keys.shape
    m = positions.shape[-1]
    base = (torch.arange(b, device=keys.device).view(b, 1, 1) * h
            + torch.arange(h, device=keys.device).view(1, h, 1)) * c
    flat = (positions.clamp_min(0) + base).reshape(-1)                                # (B*Hkv*M,)
    k = keys.reshape(b * h * c, d).index_select(0, flat).view(b, h, m, d)
    v = values.reshape(b * h * c, values.shape[-1]).index_select(0, flat).view(b, h, m, -1)
    return k, v


def pad_positions(per_seq: list[torch.Tensor]) -> torch.Tensor:
    """Per-sequence (Hkv, M_b) positions -> (B, Hkv, max M_b), -1 where a sequence has fewer."""
    m = max(p.shape[-1] for p in per_seq)
    out = per_seq[0].new_full((len(per_seq), per_seq[0].shape[0], m), -1)
    for b, p in enumerate(per_seq):
        out[b, :, :p.shape[-1]] = p
    return out


class BatchModelDraft:
    """A batched draft that runs a model one token per step: `prepare` once per round, then
    `step(tokens (B,), positions (B,)) -> (B, V)` until the controller stops, then `finish`."""

    def prepare(self, target: BatchCache, rows: list[int]) -> None:
        pass

    def finish(self, target: BatchCache) -> None:
        pass

    def draft(self, target: BatchCache, active: list, last: torch.Tensor, controller, sampler, timers):
        """-> (tokens: list of (B,), probs: list of (B, V) (sampling), entropies[step] (B floats), steps)."""
        drafted, probs, entropies, steps = [], [], [], 0
        with timers.select:
            self.prepare(target, [s.index for s in active])
        with timers.draft:
            token, position = last, target.lengths.clone()
            while True:
                logits = self.step(token, position)                                   # (B, V)
                steps += 1
                token, p = pick_rows(sampler, logits)                                 # (B,), (B, V) | None
                drafted.append(token)
                entropies.append(entropy(logits).tolist())                            # one sync per step
                if p is not None:
                    probs.append(p)
                if not controller.keep_drafting_batch([list(col) for col in zip(*entropies)]):
                    break
                position = position + 1
            self.finish(target)
        return drafted, probs, entropies, steps


class BatchDrafter(BatchModelDraft):
    """Runs the per-sequence policies of a gathered sparse-KV method as one batched draft."""

    def __init__(self, model, drafters: list, windows: list, max_k: int):
        self.drafters, self.windows = drafters, windows
        self.model = drafters[0].drafting_model
        self.dtype = drafters[0].draft_dtype
        self.cache = BatchDraftCache(num_decoder_layers(model), steps=max_k + 2)
        self.hook = BatchDraftHook(self.cache, windows)

    def prepare(self, target: BatchCache, rows: list[int]) -> None:
        """Per layer: each sequence's policy selects (Hkv, M_b) positions; gathered into the draft cache."""
        lengths = target.length_list
        for i, (full, draft) in enumerate(zip(target.layers, self.cache.layers)):
            positions = pad_positions([self.drafters[r].policy.select_positions(
                i, lengths[b], window_start(self.windows[i], lengths[b])) for b, r in enumerate(rows)])
            keys, values = gather_batch(full.keys, full.values, positions)
            draft.load(keys.to(self.dtype), values.to(self.dtype), positions)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens (B,) at absolute positions (B,) -> (B, V) next-token logits."""
        self.cache.query_position = positions.view(-1, 1)
        out = self.model(input_ids=tokens.view(-1, 1), position_ids=positions.view(-1, 1),
                         past_key_values=self.cache, use_cache=True, attn_hook=self.hook, logits_to_keep=1)
        return out.logits[:, -1]


class BatchEarlyExit(BatchModelDraft):
    """LayerSkip batched: the first `exit_layer` layers draft over the target's own `BatchCache`
    (step s of sequence b writes slot L_b + s, attends with the verification mask); the lengths
    are restored afterwards, so verification overwrites those slots."""

    def __init__(self, drafter: LayerSkipDrafter, windows: list):
        self.model, self.exit_layer, self.windows = drafter.drafting_model, drafter.exit_layer, windows
        self.target = self.lengths = None

    def prepare(self, target: BatchCache, rows: list[int]) -> None:
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


class BatchLookup:
    """Prompt lookup batched: each sequence looks up its own continuation; the batch drafts as many
    tokens as the controller allows and the longest lookup has. A sequence with a shorter lookup
    pads it with its last token: a deterministic draft like any other (greedy rejects it unless the
    target agrees; sampling accepts it with probability p(d), q being one-hot), so nothing is lost."""

    def __init__(self, drafter: PromptLookupDrafter, max_k: int):
        self.max_ngram, self.max_k = drafter.max_ngram, max_k

    def draft(self, target: BatchCache, active: list, last: torch.Tensor, controller, sampler, timers):
        with timers.draft:
            proposals = [lookup_continuation(s.state.history(), self.max_ngram, self.max_k) for s in active]
            longest = max(p.numel() for p in proposals)
            drafted = []
            for j in range(longest):
                drafted.append(torch.stack([p[j] if j < p.numel() else (p[-1] if p.numel() else s.state.last.view(()))
                                            for p, s in zip(proposals, active)]))
                if not controller.keep_drafting_batch([[0.0] * (j + 1) for _ in active]):
                    break
        return drafted, [], [[0.0] * len(active) for _ in drafted], 0


def batch_draft_for(model, seqs: list, windows: list, max_k: int):
    """The batched draft of the sequences' method (None for AR)."""
    first = seqs[0].drafter
    if isinstance(first, GatheredKVDrafter):
        return BatchDrafter(model, [s.drafter for s in seqs], windows, max_k)
    if isinstance(first, LayerSkipDrafter):
        return BatchEarlyExit(first, windows)
    if isinstance(first, PromptLookupDrafter):
        return BatchLookup(first, max_k)
    return None


# --- the loop ----------------------------------------------------------------------------------

class Sequence:
    """One sequence of the batch: its drafter (policy state), ids, output and trace."""

    def __init__(self, index: int, prompt, drafter, sampler, capacity: int, max_new_tokens: int, model):
        self.index, self.drafter = index, drafter
        n = prompt.numel()
        self.state = DecodeState(model=model, cache=None, ids=torch.zeros(capacity, dtype=torch.long,
                                 device=prompt.device), length=n, prompt_len=n, sampler=sampler,
                                 max_new_tokens=max_new_tokens)
        self.state.ids[:n] = prompt
        self.row = index            # this sequence's row in the batch cache (rows shift as others finish)
        self.tokens: list[int] = []
        self.rounds: list[Round] = []
        self.prefill_s = 0.0
        self.finished_at = 0.0      # seconds from the start of batched decoding to this sequence's end

    def wanted(self) -> int:
        return self.state.max_new_tokens - len(self.tokens)

    def done(self, stop_ids) -> bool:
        return self.wanted() <= 0 or bool(stop_ids and self.tokens and self.tokens[-1] in stop_ids)


class BatchGenerations(list):
    """One `Generation` per prompt, in order, plus the batch's own totals: `decode_s` (wall time
    of the batched loop), `prefill_s` (the B prefills, run one by one), `batch_size`."""
    decode_s: float = 0.0
    prefill_s: float = 0.0
    batch_size: int = 0

    @property
    def new_tokens(self) -> int:
        return sum(len(g.tokens) for g in self)

    @property
    def tokens_per_s(self) -> float:
        """Throughput over the batch: decode tokens of every sequence over the batch's decode time."""
        decode_tokens = sum(g.decode_tokens for g in self)
        return decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


def check_batchable(method: str, options: dict) -> None:
    if method not in batched_methods():
        raise ConfigError(f"method {method!r} does not run batched yet; batched methods: {batched_methods()}")
    if options.get("compile_draft") or options.get("static_draft"):
        raise ConfigError("static_draft/compile_draft are single-sequence options; a batch drafts over "
                          "its own padded draft cache (set them false, or decode one prompt)")


def generate_batch(model, prompts: list[torch.Tensor], *, method: str, max_new_tokens: int,
                   sampler: Sampler, stop_ids: set, cost_prior, options: dict,
                   prefilled: list | None = None) -> BatchGenerations:
    """Decode `prompts` together; see the module docstring. `prefilled` (checked by the caller):
    one shared prefill per prompt (`sparsespec.prefill`), decoded from instead of prefilling."""
    if prefilled is None:
        check_batchable(method, options)
        built = [build_method(model, p.numel(), method, max_new_tokens, dict(options)) for p in prompts]
    else:
        check_batchable(method, prefilled[0].options)
        built = [(p.drafter, p.controller, p.options) for p in prefilled]
        for p in prefilled:
            p.used = True
    device = prompts[0].device
    controller = built[0][1]                               # the batch's one controller
    if cost_prior is not None:
        controller.use_cost_prior(cost_prior)
    capacity = max(p.numel() for p in prompts) + max_new_tokens + controller.max_k + 2
    windows = [sliding_window_of(model, i) for i in range(num_decoder_layers(model))]

    seqs, prefills = [], []
    for b, (prompt, (drafter, _, _)) in enumerate(zip(prompts, built)):
        seq = Sequence(b, prompt, drafter, sampler, capacity, max_new_tokens, model)
        shared = prefill_one(model, prompt, drafter) if prefilled is None else prefilled[b].shared
        watch = Stopwatch(device)
        with watch:
            token, _ = sampler.pick(shared.logits)
            seq.state.ids[prompt.numel()] = token
            drafter.after_prefill(seq.state)
        seq.tokens.append(int(token))
        seq.prefill_s = shared.seconds + watch.seconds
        seqs.append(seq)
        prefills.append(shared)

    cache = BatchCache(num_decoder_layers(model), capacity, [p.numel() for p in prompts], device)
    cache.load(prefills)
    del prefills
    drafter = batch_draft_for(model, seqs, windows, controller.max_k)

    active = [s for s in seqs if not s.done(stop_ids)]
    if active and len(active) < len(seqs):      # none left: every sequence ended at its first token
        cache.keep([s.index for s in active])
    clock = Stopwatch(device)
    with sparsespec_attention(model), clock:
        start = time.perf_counter()
        while active:
            batch_round(model, cache, active, drafter, controller, sampler, windows)
            finished = [s for s in active if cut_and_check(s, stop_ids)]
            if finished:
                synchronize(device)
                for s in finished:
                    s.finished_at = time.perf_counter() - start
                active = [s for s in active if s not in finished]
                if active:      # finished sequences leave: their rows cost nothing from now on
                    cache.keep([s.row for s in active])
    out = BatchGenerations()
    out.decode_s, out.batch_size = clock.seconds, len(prompts)
    out.prefill_s = sum(s.prefill_s for s in seqs)
    for s, (drafter_b, _, resolved) in zip(seqs, built):
        gen = Generation(tokens=s.tokens, prefill_s=s.prefill_s, decode_s=s.finished_at, rounds=s.rounds,
                         prompt_tokens=s.state.prompt_len, method=method,
                         options={**resolved, **drafter_b.resolved_options, "batch_size": len(prompts)})
        out.append(gen)
    return out


def prefill_one(model, prompt, drafter):
    """The single-sequence prefill of one prompt (its drafter observing), in a cache of its own."""
    with sparsespec_attention(model):
        return run_prefill(model, prompt, drafter.prefill_observers(), capacity=prompt.numel(), exclusive=True)


def batch_round(model, cache: BatchCache, active: list, drafter, controller, sampler: Sampler, windows) -> None:
    """One draft-verify-accept round for every active sequence (rows of `cache` in `active` order)."""
    for row, s in enumerate(active):
        s.row = row
    device = cache.lengths.device
    wanted = max(s.wanted() for s in active)
    controller.start_round(limit=wanted - 1)
    timers = RoundTimers(device)

    # draft: (B, k) tokens, their distributions (B, k, V) when sampling, per-sequence entropies
    drafted, probs, entropies, steps = [], [], [], 0
    last = torch.stack([s.state.last.view(()) for s in active])                       # (B,)
    if drafter is not None and wanted > 1:
        drafted, probs, entropies, steps = drafter.draft(cache, active, last, controller, sampler, timers)
    k = controller.submit_count(len(drafted)) if drafted else 0
    drafts = torch.stack(drafted[:k], dim=1) if k else last.new_zeros(len(active), 0)  # (B, k)
    per_seq = [list(col)[:k] for col in zip(*entropies)] if entropies else [[] for _ in active]

    # verify [last, d_1..d_k] of every sequence in one forward; accept per sequence
    with timers.verify:
        observers = [s.drafter.verify_hook().observer if drafter is not None else None for s in active]
        hook = BatchVerifyHook(cache, windows, observers)
        inputs = torch.cat([last.view(-1, 1), drafts], dim=1)                          # (B, k+1)
        positions = cache.slots(k + 1)                                                 # (B, k+1)
        logits = target_logits(model, input_ids=inputs, position_ids=positions, past_key_values=cache,
                              use_cache=True, attn_hook=hook)                          # (B, k+1, V)
        accepted, lengths = [], []
        for row, s in enumerate(active):
            if sampler.greedy:
                a, nxt = accept_greedy(drafts[row], logits[row])
            else:
                q = torch.stack([p[row] for p in probs[:k]]) if k and probs else None   # None: one-hot drafts
                a, nxt = accept_sampling(drafts[row], q, logits[row], sampler)
            st = s.state
            st.ids[st.length + 1:st.length + 1 + a] = drafts[row, :a]
            st.length += a + 1
            st.ids[st.length] = nxt
            accepted.append(a)
            lengths.append(st.length)
        cache.set_lengths(lengths)                                                     # the rollback
    verify_s, draft_s, select_s = timers.verify.seconds, timers.draft.seconds, timers.select.seconds
    for s, a in zip(active, accepted):
        s.drafter.after_verify(s.state, None, a, k)
    trace = controller.trace() if k else {}
    controller.observe_batch(per_seq, accepted, k, draft_s / steps if steps else None, verify_s)
    for s, a, ents in zip(active, accepted, per_seq):
        st = s.state
        s.rounds.append(Round(drafted=k, accepted=a, emitted=a + 1, entropies=ents, draft_s=draft_s,
                              verify_s=verify_s, select_s=select_s, draft_steps=steps, **trace))
        s.tokens.extend(st.ids[st.length - a:st.length + 1].tolist())


def pick_rows(sampler: Sampler, logits: torch.Tensor):
    """One token per row of (B, V) logits: (B,) tokens and (B, V) distributions (None when greedy).
    Each row is drawn by `sampler.draw` on its own (V,) distribution, as a sequence alone is."""
    if sampler.greedy:
        return logits.argmax(dim=-1), None
    probs = sampler.probs(logits)
    return torch.stack([sampler.draw(p) for p in probs]), probs


def cut_and_check(s: Sequence, stop_ids) -> bool:
    """Cut the last round's tokens at EOS / max_new_tokens (its `emitted` follows); finished?"""
    last = s.rounds[-1]
    before = len(s.tokens) - last.emitted
    emitted = s.tokens[before:]
    if stop_ids:
        emitted = through_eos(emitted, stop_ids)
    emitted = emitted[:s.state.max_new_tokens - before]
    s.tokens[before:] = emitted
    last.emitted = len(emitted)
    return s.done(stop_ids)
