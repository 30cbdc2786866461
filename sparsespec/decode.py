"""`generate`: the one decode loop every method runs through.

    prefill(prompt)                      -> full KV cache, first token (one forward, shared by every
                                            method decoding this prompt: `prefill()`, sparsespec/shared_prefill.py)
    repeat until max_new_tokens or EOS:
        k     = controller's draft length (capped by the tokens still wanted)
        draft = drafter proposes d_1..d_k (sparse KV, early exit, n-grams, ... or nothing for AR)
        verify [last, d_1..d_k] in one forward over the full cache -> (k+1, V) target logits
        accept a drafts (+1 token from the target), roll the cache back to the accepted length
        drafter and controller learn from the verification

Autoregressive decoding is this loop with k = 0: every round is one forward of one token.
"""
from __future__ import annotations

import math

import torch

from . import batch
from .attention import sparsespec_attention
from .eos import eos_token_ids, through_eos
from .errors import ConfigError
from .generation import Generation, Round
from .logits import target_logits
from .method_options import build_method
from .methods.base import DecodeState
from .sampling import Sampler, accept_greedy, accept_sampling
from .shared_prefill import PrefillMemo, Prefilled, run_prefill
from .timing import RoundTimers, Stopwatch


def as_prompt_tensor(input_ids, device, vocab_size: int) -> torch.Tensor:
    """One prompt of integer token ids in [0, vocab_size), as a (L,) long tensor on `device`."""
    ids = torch.as_tensor(input_ids)
    if ids.numel() and (ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex()):
        raise ConfigError(f"input_ids must hold integer token ids, got dtype {ids.dtype}; pass the tokenizer's "
                          f"ids (torch.long), not scores or a mask")
    ids = ids.long()
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ConfigError(f"input_ids holds a batch of {ids.shape[0]} prompts where one is expected; "
                              f"generate decodes a batch given as a list of prompts or a tensor")
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ConfigError(f"input_ids must be one non-empty prompt, shape (L,) or (1, L); got {tuple(ids.shape)}")
    outside = ids[(ids < 0) | (ids >= vocab_size)]
    if outside.numel():
        raise ConfigError(f"input_ids holds token id {int(outside[0])}, outside the model's vocabulary of "
                          f"{vocab_size} (accepted: 0 to {vocab_size - 1})")
    return ids.to(device)


def prompt_of(model, input_ids) -> torch.Tensor:
    """`input_ids` as one prompt on the model's device, its ids checked against the vocabulary."""
    return as_prompt_tensor(input_ids, next(model.parameters()).device, model.get_input_embeddings().num_embeddings)


@torch.inference_mode()
def prefill(model, input_ids, *, methods: dict[str, tuple[str, dict]], max_new_tokens: int = 128,
            lengths: dict[str, int] | None = None, memo: PrefillMemo | None = None) -> dict[str, Prefilled]:
    """Prefill `input_ids` once for every method in `methods` (label -> (method, options)): one
    forward, every drafter observing it (sparsespec/shared_prefill.py). Returns label -> `Prefilled`, which
    `generate(model, input_ids, prefilled=...)` decodes from, once per label, in its own cache copy.
    `lengths`: label -> max_new_tokens for the labels that decode another length (a cost profile).
    `memo`: a `PrefillMemo` that may hold this prompt's prefill from an earlier call (then no forward
    runs; the drafters observe the kept one) and keeps it for later ones."""
    prompt = prompt_of(model, input_ids)
    lengths = {label: (lengths or {}).get(label, max_new_tokens) for label in methods}
    built = {label: build_method(model, prompt.numel(), method, lengths[label], dict(options))
             for label, (method, options) in methods.items()}
    observers = [o for drafter, _, _ in built.values() for o in drafter.prefill_observers()]
    rows = [drafter.prefill_query_rows() for drafter, _, _ in built.values()]
    with sparsespec_attention(model):
        if memo is None:
            shared = run_prefill(model, prompt, observers, capacity=prompt.numel(), exclusive=False)
        else:
            shared = memo.prefill(model, prompt, observers, None if None in rows else max(rows, default=0))
    return {label: Prefilled(shared=shared, method=methods[label][0], options=options, drafter=drafter,
                             controller=controller, max_new_tokens=lengths[label])
            for label, (drafter, controller, options) in built.items()}


def check_prefilled(prefilled: Prefilled, prompt: torch.Tensor, method, max_new_tokens, options: dict) -> None:
    """`generate(prefilled=...)` decodes what was prefilled: the same prompt, method, options and
    max_new_tokens, once."""
    if prefilled.used:
        raise ConfigError(f"this prefill of method {prefilled.method!r} was decoded already; each prefill "
                          f"serves one generate() (prefill again for another run)")
    if method not in (None, prefilled.method) or options:
        raise ConfigError(f"generate(prefilled=...) decodes the method and options given to prefill() "
                          f"({prefilled.method!r}); got method={method!r} and options {sorted(options)}")
    if max_new_tokens not in (None, prefilled.max_new_tokens):
        raise ConfigError(f"max_new_tokens={max_new_tokens!r} differs from the prefill's "
                          f"{prefilled.max_new_tokens}; pass the same value to prefill() and generate()")
    if not torch.equal(prompt, prefilled.shared.prompt):
        raise ConfigError("input_ids differ from the prompt that was prefilled")


@torch.inference_mode()
def generate(model, input_ids, *, method: str | None = None, max_new_tokens: int | None = None,
             temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
             stop_at_eos: bool = True, eos_token_id=None, prefilled: Prefilled | None = None,
             cost_prior=None, attention_mask=None, **method_options) -> "Generation | batch.BatchGenerations":
    """Decode one prompt with `method` (default "sparsespec"), `max_new_tokens` (default 128) new
    tokens; see the module docstring. Greedy when temperature == 0. With `prefilled` (from
    `prefill()`), start from that shared prefill instead of running one; the method, its options and
    max_new_tokens are the prefill's. `cost_prior`: a `CostProfile` (sparsespec.calibration) the
    controller starts from.

    A batch (a list of 1-D prompts, (B, L) ids with B > 1, or padded ids with `attention_mask`)
    is decoded together by sparsespec/batch.py and returns a `BatchGenerations`: a list of one
    `Generation` per prompt, in order."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"temperature={temperature!r} must be a finite number >= 0 (0 means greedy)")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p={top_p!r} must be a number in (0, 1]")
    device = next(model.parameters()).device
    if batch.is_batch(input_ids, attention_mask):
        return generate_batch(model, input_ids, attention_mask, method=method, max_new_tokens=max_new_tokens,
                              temperature=temperature, top_p=top_p, seed=seed, stop_at_eos=stop_at_eos,
                              eos_token_id=eos_token_id, prefilled=prefilled, cost_prior=cost_prior,
                              options=method_options)
    prompt = prompt_of(model, input_ids)
    if prefilled is None:
        prefilled = prefill_alone(model, prompt, method or "sparsespec",
                                  128 if max_new_tokens is None else max_new_tokens, method_options)
    else:
        check_prefilled(prefilled, prompt, method, max_new_tokens, method_options)
    if cost_prior is not None:
        prefilled.controller.use_cost_prior(cost_prior)

    generator = None
    if seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    sampler = Sampler(temperature=temperature, top_p=top_p, generator=generator)
    stop_ids = eos_token_ids(model, eos_token_id) if stop_at_eos else set()

    with sparsespec_attention(model):
        gen = decode_from(prefilled, sampler, stop_ids)
    gen.method = prefilled.method
    gen.options = {**prefilled.options, **prefilled.drafter.resolved_options}
    return gen


def generate_batch(model, input_ids, attention_mask, *, method, max_new_tokens, temperature, top_p, seed,
                   stop_at_eos, eos_token_id, prefilled, cost_prior, options) -> "batch.BatchGenerations":
    """`generate` for a batch of prompts (sparsespec/batch.py). `prefilled`: one `Prefilled` per
    prompt, in order (each from `prefill()` of that prompt), of one method; the batch then decodes
    from those shared prefills instead of prefilling its prompts."""
    prompts = batch.prompts_of(input_ids, attention_mask, lambda ids: prompt_of(model, ids))
    if prefilled is not None:
        prefilled = list(prefilled) if isinstance(prefilled, (list, tuple)) else [prefilled]
        if len(prefilled) != len(prompts):
            raise ConfigError(f"generate(prefilled=...) of a batch takes one prefill per prompt: "
                              f"got {len(prefilled)} for {len(prompts)} prompts")
        for p, prompt in zip(prefilled, prompts):
            check_prefilled(p, prompt, method, max_new_tokens, options)
            if (p.method, p.options, p.max_new_tokens) != (prefilled[0].method, prefilled[0].options,
                                                          prefilled[0].max_new_tokens):
                raise ConfigError(f"a batch decodes one method: prefills of {p.method!r} and "
                                  f"{prefilled[0].method!r} (or of different options) were given together")
        method, max_new_tokens = prefilled[0].method, prefilled[0].max_new_tokens
    method = method or "sparsespec"
    max_new_tokens = 128 if max_new_tokens is None else max_new_tokens
    device = prompts[0].device
    generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
    sampler = Sampler(temperature=temperature, top_p=top_p, generator=generator)
    stop_ids = eos_token_ids(model, eos_token_id) if stop_at_eos else set()
    return batch.generate_batch(model, prompts, method=method, max_new_tokens=max_new_tokens, sampler=sampler,
                                stop_ids=stop_ids, cost_prior=cost_prior, options=options, prefilled=prefilled)


def prefill_alone(model, prompt: torch.Tensor, method: str, max_new_tokens: int, options: dict) -> Prefilled:
    """The prefill of a method decoding alone: written straight into the cache it decodes in."""
    drafter, controller, options = build_method(model, prompt.numel(), method, max_new_tokens, options)
    return prefill_for(model, prompt, drafter, controller, max_new_tokens, method=method, options=options)


def prefill_for(model, prompt: torch.Tensor, drafter, controller, max_new_tokens: int, *, method: str = "",
                options: dict | None = None) -> Prefilled:
    """Prefill for one built drafter and controller, in the cache they decode in."""
    capacity = prompt.numel() + max_new_tokens + controller.max_k + 2
    with sparsespec_attention(model):
        shared = run_prefill(model, prompt, drafter.prefill_observers(), capacity=capacity, exclusive=True)
    return Prefilled(shared=shared, method=method or drafter.name, options=options or {}, drafter=drafter,
                     controller=controller, max_new_tokens=max_new_tokens)


def decode(model, prompt: torch.Tensor, drafter, controller, sampler: Sampler, max_new_tokens: int,
           stop_ids: set[int]) -> Generation:
    """Prefill and decode with a drafter and controller built by hand (tests, new drafters)."""
    return decode_from(prefill_for(model, prompt, drafter, controller, max_new_tokens), sampler, stop_ids)


def decode_from(prefilled: Prefilled, sampler: Sampler, stop_ids: set[int]) -> Generation:
    """Decode from a prefill: pick the first token from its logits, let the drafter take in what it
    observed, then run rounds until max_new_tokens or EOS."""
    prefilled.used = True
    shared, drafter, controller = prefilled.shared, prefilled.drafter, prefilled.controller
    prompt, n, max_new_tokens = shared.prompt, shared.prompt.numel(), prefilled.max_new_tokens
    capacity = prefilled.capacity
    state = DecodeState(model=drafter.model, cache=shared.cache_for(capacity),
                        ids=torch.zeros(capacity, dtype=torch.long, device=prompt.device), length=n,
                        prompt_len=n, sampler=sampler, max_new_tokens=max_new_tokens)
    state.ids[:n] = prompt                 # the cache holds the prompt; ids[n] is the first new token

    own_prefill = Stopwatch(prompt.device)  # this method's share of the prefill: its first token, its set-up
    with own_prefill:
        token, _ = sampler.pick(shared.logits)
        state.ids[n] = token
        drafter.after_prefill(state)
    tokens: list[int] = [int(token)]
    rounds: list[Round] = []

    timers = RoundTimers(prompt.device)
    decode_watch = Stopwatch(prompt.device)
    with decode_watch:
        while len(tokens) < max_new_tokens and not (stop_ids and tokens[-1] in stop_ids):
            rounds.append(decode_round(state, drafter, controller, timers, max_new_tokens - len(tokens)))
            emitted = state.ids[state.length - rounds[-1].emitted + 1:state.length + 1].tolist()
            tokens.extend(cut_at_eos(emitted, stop_ids, rounds[-1]))
    return Generation(tokens=tokens, prefill_s=shared.seconds + own_prefill.seconds, decode_s=decode_watch.seconds,
                      rounds=rounds, prompt_tokens=n)


def decode_round(state: DecodeState, drafter, controller, timers: RoundTimers, wanted: int) -> Round:
    """One draft-verify-accept round; it emits at most `wanted` tokens."""
    controller.start_round(limit=wanted - 1)   # the target always adds one token after the drafts
    drafted = drafter.draft(state, controller, timers) if wanted > 1 else None
    k = controller.submit_count(len(drafted.tokens)) if drafted else 0
    drafts = torch.stack(drafted.tokens[:k]) if k else state.ids[:0]
    select_s, draft_s = timers.select.lap(), timers.draft.lap()

    with timers.verify:
        hook = drafter.verify_hook()
        inputs = torch.cat([state.last.view(1), drafts]).view(1, -1)            # (1, k+1)
        positions = torch.arange(state.length, state.length + k + 1, device=state.device).view(1, -1)
        logits = verify_logits(state.model, input_ids=inputs, position_ids=positions,
                               past_key_values=state.cache, use_cache=True, attn_hook=hook)  # (k+1, V)
        if state.sampler.greedy:
            accepted, next_token = accept_greedy(drafts, logits)
        else:
            probs = torch.stack(drafted.probs[:k]) if k and drafted.probs is not None else None
            accepted, next_token = accept_sampling(drafts, probs, logits, state.sampler)
        # keep [last, d_1..d_a] in the cache; the target's token becomes the new `last`
        state.ids[state.length + 1:state.length + 1 + accepted] = drafts[:accepted]
        state.length += accepted + 1
        state.cache.truncate(state.length)
        state.ids[state.length] = next_token
    verify_s = timers.verify.lap()
    drafter.after_verify(state, hook, accepted, k)

    entropies = torch.stack(drafted.entropies).tolist() if drafted and drafted.entropies else []
    trace = controller.trace() if k else {}
    steps = drafted.steps if drafted else 0
    controller.observe(entropies[:k], accepted, k, draft_s / steps if steps else None, verify_s)
    return Round(drafted=k, accepted=accepted, emitted=accepted + 1, entropies=entropies[:k],
                 draft_s=draft_s, verify_s=verify_s, select_s=select_s, draft_steps=steps, **trace)


def verify_logits(model, **inputs) -> torch.Tensor:
    """The target's logits at every verified position of one sequence, (q, V) (sparsespec/logits.py)."""
    return target_logits(model, **inputs)[0]


def cut_at_eos(emitted: list[int], stop_ids: set[int], round_: Round) -> list[int]:
    """Drop what follows an EOS; the round's `emitted` count follows."""
    emitted = through_eos(emitted, stop_ids)
    round_.emitted = len(emitted)
    return emitted
