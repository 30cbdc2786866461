"""A short cost profile, measured before anything is timed: the entropy controller's prior.

The controller's choice k* = argmax (1 + sum pi_m) / (k C_d + C_v(k)) is only as good as its costs.
Measured online from a few single rounds, C_v(k)'s slope is noise on a shared CPU. Instead, one
untimed generation on the real prompt cycles k through `ks`, `repeats` times, and the medians become
the controller's starting costs (`generate(..., cost_prior=profile)`), refined online from there
(`profile_of`, sparsespec/controllers/cost_profile.py):

    C_d    = median over draft steps of (draft seconds / draft steps)
    C_v(k) = median over the rounds that verified k drafts of their verify seconds
    C_s    = median over the rounds with a draft of their KV-selection seconds
    C_AR   = median over the rounds with no draft (the cycle's k = 0 rounds, `profile_cycle`) of their
             whole seconds (selection + draft + verify, as the fallback rule counts a round)

The same rounds seed the controller's acceptance model, so a prompt does not open at k = 1:

    mu_acc = mean entropy of accepted drafts;  mu_rej = mean entropy of each round's first rejected draft
    rate   = accepted drafts / judged drafts (accepted + first rejected)
    bins   = judged and accepted drafts per entropy bin (the default "binned" acceptance model)

The harness measures it (sparsespec/harness/calibration.py) from the shared prefill of the first prompt (or batch) a run decodes: `profile_decoder`
gives the method, options and length to prefill beside the run's methods, and `measure_cost_profile(...,
prefilled=...)` decodes from it, so the profile costs no prefill of its own.

A batch's controller chooses one k for the batch from the batch's costs, so its profile is measured
on a batch (`input_ids` a list of prompts): the same cycle, every sequence drafting the same k, each
round's seconds the batch's, the acceptance pooled over the sequences, and only the rounds the whole
batch took part in (`full_batch_rounds`). Without it a batch opens on two warm-up rounds' timings,
and one slow round can set C_v's line so steep that it predicts C_v(1) < 0 and the batch drafts
k = 1 to the end (docs/benchmark.md, "Batched decoding", has the measured case).

"""
from __future__ import annotations

import torch

from sparsespec.api import generate
from sparsespec.controllers import CycleK
from sparsespec.controllers.cost_profile import CostProfile, full_batch_rounds, profile_of
from sparsespec.engine.attention import DEFAULT_AR_ATTENTION
from sparsespec.engine.loop import is_batch
from sparsespec.errors import ConfigError
from sparsespec.methods import METHODS

DEFAULT_KS = CycleK.Options().ks
MIN_AR_STEPS = 4       # AR steps timed per thread count: a median that one slow step does not move
PLAIN_ROUNDS = MIN_AR_STEPS - 1   # k = 0 rounds per cycle: with the profile's last round, C_AR from >= MIN_AR_STEPS


def profile_decoder(method: str, options: dict, ks=DEFAULT_KS, repeats: int = 2) -> tuple[str, dict, int]:
    """(method, options, max_new_tokens) of a profile's generation: `method` with its drafter options
    (controller options dropped), the cycle controller over `profile_cycle(ks)`, one round per k per
    repeat, then one token. Prefill it beside the methods (`prefill(..., lengths=...)`) to profile on
    their prefill."""
    if method not in METHODS or not METHODS[method].drafts:
        raise ConfigError(f"a cost profile needs a drafting method; got {method!r}")
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ConfigError(f"repeats={repeats!r} must be an integer >= 1")
    drafter_options = {k: v for k, v in options.items() if k in METHODS[method].Options.names()}
    cycle = profile_cycle(ks)
    return method, {**drafter_options, "controller": "cycle", "ks": cycle}, cycle_tokens(cycle, repeats)


def profile_cycle(ks) -> tuple[int, ...]:
    """The ks a profile cycles through: `ks`, then PLAIN_ROUNDS rounds of k = 0, each one AR step
    of this very method (its verification hooks included), as the fallback runs it: C_AR."""
    return tuple(ks) + (0,) * PLAIN_ROUNDS


def cycle_tokens(ks, repeats: int) -> int:
    """Tokens a cycle profile decodes: k + 1 per round, one round per k per repeat, then one token."""
    return repeats * sum(k + 1 for k in ks) + 1


def measure_cost_profile(model, input_ids, *, method: str = "sparsespec", ks=DEFAULT_KS, repeats: int = 2,
                         prefilled=None, ar_attention: str = DEFAULT_AR_ATTENTION, **options) -> CostProfile:
    """Draft k = each of `ks` in turn, `repeats` times, on `input_ids` (one prompt, or a list of
    prompts decoded as one batch); the median costs per k. `options` are the method's; controller
    options among them are ignored (the cycle replaces them). `prefilled`: the profile's start (one
    `Prefilled`, or one per prompt of a batch) from a prefill shared with the run's methods, made with
    `profile_decoder`'s method, options and length; then no prefill of its own is run. Measured at the
    process's thread count (no online thread choice)."""
    prompts = input_ids if is_batch(input_ids, None) else [input_ids]     # one prompt: a batch of one
    if prefilled is None:
        method, profile_options, new_tokens = profile_decoder(method, options, ks, repeats)
        gens = generate(model, prompts, method=method, max_new_tokens=new_tokens, stop_at_eos=False,
                        ar_attention=ar_attention, threads=torch.get_num_threads(), remember=False,
                        **profile_options)
    else:
        gens = generate(model, prompts, prefilled=prefilled, stop_at_eos=False, ar_attention=ar_attention,
                        threads=torch.get_num_threads(), remember=False)
    return profile_of(full_batch_rounds(gens))
