"""What earlier `generate` calls on a model learned about this machine, for the next call.

Without a cost profile a generation spends its first rounds measuring: an AR step (C_AR), warm-up
rounds at k = 2, 4, 8 (C_d and C_v's slope), both thread counts. At 64 tokens of a 4K prompt that is
much of the generation. The harness measures a profile once per run and starts every prompt from it
(sparsespec/harness/calibration.py); a library user calling `generate` prompt after prompt gets
the same from the calls before:

    key     the model object, and what costs and acceptance depend on: the method and its resolved
            options, the batch size, the context (the longest prompt in half-octaves: 2.9K-4.1K tokens
            share a key), the sampling settings, how AR steps attend, and the caller's thread count
    recall  a call given no `cost_prior` starts from its key's profile, as from the harness's: no
            warm-up, the fallback's C_AR known, the acceptance worth `prior_strength` judged drafts;
            with threads="auto" and no `thread_prior`, from the count the key's last call ended on
    keep    after the call: `profile_of` its rounds (a batch's: the rounds the whole batch ran),
            `merged` over the key's profile (a k or C_AR this call did not run keeps its earlier
            value), and the count its thread rule ended on

What is recalled is where a call starts, not what it decides: the cost EMAs and the fallback's window
are replaced by this call's measured rounds within a few rounds, and the thread rule re-probes after
16. The tokens do not depend on it (greedy: identical; sampled: the model's distribution); only the
choice of k and of threads reads it.

Kept per model object (a weak reference: gone with the model), in this process only.
`generate(..., remember=False)` neither recalls nor keeps (the harness, which measures its own
profile); `forget(model)` empties one model's memory, `forget()` every model's.
"""
from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass

import torch

from sparsespec.controllers.cost_profile import CostProfile, drafted_any, full_batch_rounds, merged, profile_of


@dataclass(frozen=True)
class Learned:
    """What the calls of one key learned: their merged cost profile (None: no call drafted, or the
    controller reads no costs) and the thread count the last one ended on (None: no online rule)."""
    profile: CostProfile | None
    threads: int | None


_MEMORY: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple, Learned]]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()           # generate() may be called from several Python threads


def context_bucket(tokens: int) -> int:
    """Half-octaves of the context: 2 log2(tokens), rounded. Costs grow with the context; within a
    bucket they differ by less than the spread of a quiet machine's rounds."""
    return round(2 * math.log2(max(tokens, 1)))


def key_of(starts: list, sampler, ar_attention: str) -> tuple:
    """The key of a call decoding from `starts` (module docstring)."""
    first = starts[0]
    longest = max(s.shared.prompt.numel() for s in starts)
    return (first.method, repr(sorted(first.options.items())), len(starts), context_bucket(longest),
            sampler.temperature, sampler.top_p, ar_attention, torch.get_num_threads(),
            first.shared.prompt.device.type)


def recall(model, key: tuple) -> Learned | None:
    with _LOCK:
        return _MEMORY.get(model, {}).get(key)


def keep(model, key: tuple, gens, thread_report: dict, reads_costs: bool) -> Learned:
    """Merge what this call's generations `gens` learned into `key`'s memory; returns the new entry."""
    rounds = full_batch_rounds(gens)
    with _LOCK:
        earlier = _MEMORY.setdefault(model, {}).get(key)
        profile = earlier.profile if earlier is not None else None
        if reads_costs and drafted_any(rounds):
            profile = merged(profile, profile_of(rounds))
        threads = thread_report.get("threads_final")
        learned = Learned(profile=profile, threads=threads if threads is not None else
                          (earlier.threads if earlier is not None else None))
        _MEMORY[model][key] = learned
        return learned


def learned(model) -> dict[tuple, Learned]:
    """What `model`'s calls have learned, key -> entry (a copy, for inspection)."""
    with _LOCK:
        return dict(_MEMORY.get(model, {}))


def forget(model=None) -> None:
    """Empty `model`'s memory (None: every model's); the next call opens as a first call."""
    with _LOCK:
        if model is None:
            _MEMORY.clear()
        else:
            _MEMORY.pop(model, None)
