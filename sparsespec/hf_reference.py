"""Reference rows from transformers' own `generate()`, timed like sparsespec's methods (as Spec-Bench
adds them): `hf_generate` (greedy or sampled decoding), `hf_generate_static` (the fastest plain
`generate()` a transformers user can build: a static cache and, by default, a `torch.compile`d decode
step) and `hf_pld` (transformers' prompt lookup, `prompt_lookup_num_tokens`). They validate the AR
denominator: plain decoding in sparsespec should run at least as fast as transformers' own, and
decode the same tokens.

`hf_generate_static` first runs an untimed generation of WARMUP_TOKENS on the same prompt with the
same static cache length, so compilation (and the cache's allocation) lands outside the timed call;
its seconds are reported in the row's options as `compile_s`, never in its speed.

Timing: a stopping criterion stamps the (synchronised) clock after every step of transformers'
loop. The first stamp ends the prefill; every later one ends a round, whose `emitted` tokens are the
sequence's growth since the previous stamp and whose `verify_s` is the time between the two. For
`hf_pld`, `drafted` is the number of candidates transformers' prompt-lookup generator proposed in
that round. `decode_s` runs from the first stamp to the return of `generate()`.

These rows run transformers' own prefill, not the prompt's shared one: transformers' assisted
decoding feeds the whole input on its first step, so it cannot start from a filled cache. For the
same reason transformers' first prompt-lookup round is fused with its prefill: the tokens it
accepts there count as prefill output, so `len(tokens) == prefill tokens + sum(emitted)`.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from sparsespec.engine.eos import eos_token_ids
from sparsespec.errors import ConfigError
from sparsespec.engine.generation import Generation, Round
from sparsespec.options import NoOptions, OptionSet, at_least, option
from sparsespec.engine.timing import synchronize

@dataclass(frozen=True)
class PromptLookupOptions(OptionSet):
    prompt_lookup_num_tokens: int = option(10, "transformers' default; sparsespec's pld drafts k=10 to match",
                                           check=at_least(1))
    max_matching_ngram_size: int = option(2, "transformers' default; sparsespec's pld max_ngram to match",
                                          check=at_least(1))


@dataclass(frozen=True)
class StaticOptions(OptionSet):
    compile: bool = option(True, "torch.compile the decode step over the static cache, as transformers does on GPUs")


OPTIONS: dict[str, type[OptionSet]] = {"hf_generate": NoOptions, "hf_generate_static": StaticOptions,
                                       "hf_pld": PromptLookupOptions}
WARMUP_TOKENS = 3       # a few decode steps: the compiled step runs (and compiles) before the timed call


def is_reference(method: str) -> bool:
    return method in OPTIONS


def resolve_options(method: str, options: dict) -> dict:
    """The options `method` runs with, declared defaults filled in; a one-line ConfigError on a bad one."""
    return OPTIONS[method].build(options, f"method {method!r}").as_dict()


class StepClock:
    """A transformers stopping criterion that never stops: it records (seconds, sequence length)
    after every step of the generation loop."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stamps: list[tuple[float, int]] = []

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        synchronize(self.device)
        self.stamps.append((time.perf_counter(), input_ids.shape[1]))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


@contextmanager
def counting_candidates(model, counts: list[int]):
    """While active, every candidate generator `model.generate` builds appends the number of
    candidate tokens it proposes, per round, to `counts`."""
    build = model._get_candidate_generator

    def build_counting(*args, **kwargs):
        generator = build(*args, **kwargs)
        propose = generator.get_candidates

        def get_candidates(input_ids, *a, **kw):
            candidates, logits = propose(input_ids, *a, **kw)
            counts.append(candidates.shape[1] - input_ids.shape[1])
            return candidates, logits
        generator.get_candidates = get_candidates
        return generator

    model._get_candidate_generator = build_counting
    try:
        yield
    finally:
        del model._get_candidate_generator          # back to the class's method


def decoding_kwargs(model, *, temperature: float, top_p: float, stop_at_eos: bool, eos_token_id) -> dict:
    if stop_at_eos:
        eos = sorted(eos_token_ids(model, eos_token_id))
        eos_kwargs = {"eos_token_id": eos or None, "pad_token_id": eos[0] if eos else 0}
    else:
        eos_kwargs = {"eos_token_id": None, "pad_token_id": 0}
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p} if temperature > 0 else {
        "do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {**eos_kwargs, **sampling}


def rounds_from_stamps(stamps: list[tuple[float, int]], drafted: list[int]) -> list[Round]:
    """One Round per stamp after the first (the prefill's)."""
    rounds = []
    for i in range(1, len(stamps)):
        emitted = stamps[i][1] - stamps[i - 1][1]
        k = drafted[i] if i < len(drafted) else 0
        rounds.append(Round(drafted=k, accepted=min(emitted - 1, k), emitted=emitted, entropies=[], draft_s=0.0,
                            verify_s=stamps[i][0] - stamps[i - 1][0]))
    return rounds


@torch.inference_mode()
def hf_generate(model, input_ids, *, method: str = "hf_generate", max_new_tokens: int = 128,
                temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
                stop_at_eos: bool = True, eos_token_id=None, **options) -> Generation:
    """Decode one prompt with transformers' `model.generate()` and return a `Generation` timed
    and counted as sparsespec's own (see the module docstring)."""
    options = resolve_options(method, options)
    device = next(model.parameters()).device
    ids = torch.as_tensor(input_ids, dtype=torch.long, device=device).view(1, -1)
    n = ids.shape[1]
    clock, drafted = StepClock(device), []
    decoding = decoding_kwargs(model, temperature=temperature, top_p=top_p, stop_at_eos=stop_at_eos,
                               eos_token_id=eos_token_id)
    generate_options = dict(options)
    if method == "hf_generate_static":
        generate_options = static_cache_kwargs(device, n + max_new_tokens, compile=options["compile"])
        options = {**options, "compile_s": warm_up_static(model, ids, generate_options, decoding)}
    if seed is not None:
        torch.manual_seed(seed)
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, stopping_criteria=[clock],
                  **decoding, **generate_options)
    synchronize(device)
    start = time.perf_counter()
    with counting_candidates(model, drafted):
        out = model.generate(ids, **kwargs)
    synchronize(device)
    end = time.perf_counter()
    first = clock.stamps[0][0]
    return Generation(tokens=out[0, n:].tolist(), prefill_s=first - start, decode_s=end - first,
                      rounds=rounds_from_stamps(clock.stamps, drafted), method=method, prompt_tokens=n,
                      options=options)


def static_cache_kwargs(device: torch.device, cache_len: int, *, compile: bool) -> dict:
    """generate() keywords for a static cache of `cache_len` positions, its decode step compiled
    (transformers compiles on its own only on accelerators; on a CPU it is asked to, without CUDA graphs)."""
    from transformers import CompileConfig

    kwargs = {"cache_implementation": "static", "max_cache_len": cache_len}
    if not compile:
        return {**kwargs, "disable_compile": True}
    config = CompileConfig() if device.type == "cuda" else CompileConfig(mode="default")
    if device.type not in ("cuda", "xpu"):
        config._compile_all_devices = True
    return {**kwargs, "compile_config": config}


def warm_up_static(model, ids: torch.Tensor, generate_options: dict, decoding: dict) -> float:
    """Seconds of an untimed WARMUP_TOKENS generation with the same static cache: compilation, once per
    cache shape, and the cache's allocation happen here."""
    device = ids.device
    synchronize(device)
    start = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=WARMUP_TOKENS,
                   **{**decoding, "do_sample": False, "temperature": None, "top_p": None, "top_k": None},
                   **generate_options)
    synchronize(device)
    return time.perf_counter() - start
