"""`generate` and `prefill`: the library's front door to the one decode loop (sparsespec/engine/loop.py).

    prefill(prompt)                      -> full KV cache, first token (one forward, shared by every
                                            method decoding this prompt: `prefill()`, sparsespec/engine/prefill.py)
    repeat until max_new_tokens or EOS:
        k     = controller's draft length (capped by the tokens still wanted)
        draft = drafter proposes d_1..d_k (sparse KV, early exit, n-grams, ... or nothing for AR)
        verify [last, d_1..d_k] in one forward over the full cache -> (k+1, V) target logits
        accept a drafts (+1 token from the target), roll the cache back to the accepted length
        drafter and controller learn from the verification

Autoregressive decoding is this loop with k = 0: every round is one forward of one token. One prompt
is a batch of one: here the inputs are checked, each prompt prefilled (or its shared prefill taken),
and the loop decodes them.

Prefill names, one per concept: `prefill` (the act, for one or several methods), `SharedPrefill`
(one prompt's forward: its cache, logits and time), `Prefilled` (one method's start from it, what
`generate(prefilled=...)` takes), `PrefillMemo` and its `KeptPrefill` entries (prefills kept for
later runs; sparsespec/engine/prefill.py).
"""
from __future__ import annotations

import math

import torch

from sparsespec import call_memory
from sparsespec.engine import loop
from sparsespec.engine.attention import AR_ATTENTION, DEFAULT_AR_ATTENTION, sparsespec_attention
from sparsespec.call_checks import check_seed, warn_past_positions
from sparsespec.engine.eos import eos_token_ids
from sparsespec.errors import ConfigError
from sparsespec.engine.generation import Generation
from sparsespec.method_options import build_method
from sparsespec.engine.sampling import Sampler
from sparsespec.engine.prefill import PrefillMemo, Prefilled
from sparsespec.engine.thread_rule import AUTO, thread_rule


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
    forward, every drafter observing it (sparsespec/engine/prefill.py). Returns label -> `Prefilled`, which
    `generate(model, input_ids, prefilled=...)` decodes from, once per label, in its own cache copy.
    `lengths`: label -> max_new_tokens for the labels that decode another length (a cost profile).
    `memo`: a `PrefillMemo` that may hold this prompt's prefill from an earlier call (then no forward
    runs; the drafters observe the kept one) and keeps it for later ones."""
    prompt = prompt_of(model, input_ids)
    lengths = {label: (lengths or {}).get(label, max_new_tokens) for label in methods}
    built = {label: (method, *build_method(model, prompt.numel(), method, lengths[label], dict(options)),
                     lengths[label]) for label, (method, options) in methods.items()}
    return prefill_built(model, prompt, built, memo=memo)


def prefill_built(model, prompt: torch.Tensor, built: dict[str, tuple], *, memo: PrefillMemo | None = None,
                  in_place: bool = False) -> dict[str, Prefilled]:
    """One prefill of `prompt` (served by `memo`, or run), every built method's drafter observing it,
    and each label's start from it. `built`: label -> (method, drafter, controller, options,
    max_new_tokens). `in_place`: one method, with room after the prompt for its decoding too, so that
    a batch of one decodes in the prefill's cache without a copy."""
    room = 0
    if in_place:                                   # room for the one method's output + one round of drafts
        (_, _, controller, _, length), = built.values()
        room = length + controller.max_k + 2
    observers = [o for _, drafter, _, _, _ in built.values() for o in drafter.prefill_observers()]
    rows = [drafter.prefill_query_rows() for _, drafter, _, _, _ in built.values()]
    with sparsespec_attention(model):
        memo = PrefillMemo() if memo is None else memo          # an empty memo runs the forward
        shared = memo.serve(model, prompt, observers, None if None in rows else max(rows, default=0), room)
    return {label: Prefilled(shared=shared, method=method, options=options, drafter=drafter, controller=controller,
                             max_new_tokens=length)
            for label, (method, drafter, controller, options, length) in built.items()}


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
             cost_prior=None, attention_mask=None, ar_attention: str = DEFAULT_AR_ATTENTION,
             threads: int | str = AUTO, thread_prior: int | None = None, remember: bool = True,
             **method_options) -> "Generation | loop.BatchGenerations":
    """Decode one prompt with `method` (default "sparsespec"), `max_new_tokens` (default 128) new
    tokens; see the module docstring. Greedy when temperature == 0. With `prefilled` (from
    `prefill()`), start from that shared prefill instead of running one; the method, its options and
    max_new_tokens are the prefill's. `cost_prior`: a `CostProfile` (sparsespec.calibration) the
    controller starts from. `ar_attention`: how an AR step (the `ar` method's, and every k = 0
    round of the others) attends, one of `AR_ATTENTION` (sparsespec/engine/attention.py); the harness
    measures them and passes the fastest. `threads`: "auto" chooses the intra-op thread count online,
    between 1 and the process's default, from the rounds' own costs, and re-probes when they move
    (sparsespec/engine/thread_rule.py); `thread_prior` is the count it starts from (the harness's
    probe); a positive int fixes the count. The caller's count is restored at the end. `remember`:
    start from what earlier calls on this model learned (their costs and acceptance, where no
    `cost_prior` is given; their thread count, where "auto" has no `thread_prior`) and keep what
    this call learns (sparsespec/call_memory.py); False: a call on its own. Greedy tokens are the same
    either way; a sampling call with a `seed` recalls nothing, so that it draws the same tokens
    whatever calls came before it. `Generation.options["recalled"]`: whether an earlier call's profile
    was used.

    A batch (a list of 1-D prompts, (B, L) ids with B > 1, or padded ids with `attention_mask`)
    is decoded together and returns a `BatchGenerations`: a list of one `Generation` per prompt, in
    order, with `prefilled` one `Prefilled` per prompt. One prompt is a batch of one of the same loop."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"temperature={temperature!r} must be a finite number >= 0 (0 means greedy)")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p={top_p!r} must be a number in (0, 1]")
    check_seed(seed)
    if ar_attention not in AR_ATTENTION:
        raise ConfigError(f"ar_attention={ar_attention!r}; accepted: {', '.join(AR_ATTENTION)}")
    rule = thread_rule(threads, thread_prior)
    if not isinstance(remember, bool):
        raise ConfigError(f"remember={remember!r}; accepted: True (start from earlier calls on this model) or False")
    batched = loop.is_batch(input_ids, attention_mask)
    prompts = (loop.prompts_of(input_ids, attention_mask, lambda ids: prompt_of(model, ids)) if batched
               else [prompt_of(model, input_ids)])
    device = prompts[0].device
    generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
    sampler = Sampler(temperature=temperature, top_p=top_p, generator=generator)
    stop_ids = eos_token_ids(model, eos_token_id) if stop_at_eos else set()
    starts = starts_of(model, prompts, method=method, max_new_tokens=max_new_tokens, options=method_options,
                       prefilled=prefilled)
    key = call_memory.key_of(starts, sampler, ar_attention) if remember else None
    # a seeded sampling call draws what its arguments say, whatever calls came before it
    learned = call_memory.recall(model, key) if remember and not (temperature > 0 and seed is not None) else None
    recalled = cost_prior is None and learned is not None and learned.profile is not None
    cost_prior = learned.profile if recalled else cost_prior
    if threads == AUTO and thread_prior is None and learned is not None and learned.threads is not None:
        rule = thread_rule(threads, learned.threads)          # the count the last call ended on
    gens = decode_starts(model, starts, sampler, stop_ids, cost_prior, ar_attention, rule)
    if remember:
        call_memory.keep(model, key, gens, rule.report(), starts[0].controller.reads_costs)
    for gen in gens:
        gen.options["recalled"] = recalled
    if not batched:
        return gens[0]
    for gen in gens:
        gen.options["batch_size"] = len(gens)
    return gens


def decode_prompts(model, prompts: list[torch.Tensor], *, method: str | None, max_new_tokens: int | None,
                   options: dict, sampler: Sampler, stop_ids: set, cost_prior=None,
                   prefilled=None, ar_attention: str = DEFAULT_AR_ATTENTION,
                   thread_rule=None) -> "loop.BatchGenerations":
    """`prompts` (checked 1-D prompts) decoded by the loop (sparsespec/engine/loop.py: together, or one at
    a time for a method that is not batchable), each from its prefill: `prefilled` (one `Prefilled`
    per prompt, of one method), or its own; `thread_rule`: the count each round runs at (None: the
    process's count). No call memory: what `generate` is without it."""
    starts = starts_of(model, prompts, method=method, max_new_tokens=max_new_tokens, options=options,
                       prefilled=prefilled)
    return decode_starts(model, starts, sampler, stop_ids, cost_prior, ar_attention, thread_rule)


def starts_of(model, prompts: list[torch.Tensor], *, method: str | None, max_new_tokens: int | None,
              options: dict, prefilled=None) -> list[Prefilled]:
    """One `Prefilled` per prompt: `prefilled`'s, checked, or each prompt's own prefill with the
    method built (defaults: "sparsespec", 128 new tokens)."""
    if prefilled is not None:
        return checked_starts(prefilled, prompts, method, max_new_tokens, options)
    method = method or "sparsespec"
    max_new_tokens = 128 if max_new_tokens is None else max_new_tokens
    built = [build_method(model, p.numel(), method, max_new_tokens, dict(options)) for p in prompts]
    # each sequence decodes in its own prefill's cache
    alone = len(prompts) == 1 or loop.one_at_a_time(built[0][0], len(prompts))
    return [prefill_built(model, p, {method: (method, drafter, controller, resolved, max_new_tokens)},
                          in_place=alone)[method] for p, (drafter, controller, resolved) in zip(prompts, built)]


def decode_starts(model, starts: list[Prefilled], sampler: Sampler, stop_ids: set, cost_prior,
                  ar_attention: str, thread_rule) -> "loop.BatchGenerations":
    """The loop from `starts`, after the one warning about positions past the model's trained range."""
    warn_past_positions(model, max(s.shared.prompt.numel() for s in starts), starts[0].max_new_tokens)
    return loop.decode(model, starts, sampler, stop_ids, cost_prior, ar_attention, thread_rule)


def checked_starts(prefilled, prompts: list[torch.Tensor], method, max_new_tokens, options: dict) -> list[Prefilled]:
    """`prefilled` (one `Prefilled`, or one per prompt) as a list, each checked against its prompt;
    a batch decodes one method, options and max_new_tokens."""
    starts = list(prefilled) if isinstance(prefilled, (list, tuple)) else [prefilled]
    if len(starts) != len(prompts):
        raise ConfigError(f"generate(prefilled=...) of a batch takes one prefill per prompt: "
                          f"got {len(starts)} for {len(prompts)} prompts")
    for p, prompt in zip(starts, prompts):
        check_prefilled(p, prompt, method, max_new_tokens, options)
        if (p.method, p.options, p.max_new_tokens) != (starts[0].method, starts[0].options, starts[0].max_new_tokens):
            raise ConfigError(f"a batch decodes one method: prefills of {p.method!r} and "
                              f"{starts[0].method!r} (or of different options) were given together")
    return starts


def decode(model, prompt: torch.Tensor, drafter, controller, sampler: Sampler, max_new_tokens: int,
           stop_ids: set[int], thread_rule=None) -> Generation:
    """Prefill and decode one prompt with a drafter and controller built by hand (tests, new drafters);
    `thread_rule`: the count each round runs at (None: the process's count)."""
    start = prefill_built(model, prompt, {drafter.name: (drafter.name, drafter, controller, {}, max_new_tokens)},
                          in_place=True)[drafter.name]
    return loop.decode(model, [start], sampler, stop_ids, thread_rule=thread_rule)[0]
