"""A short cost profile, measured before anything is timed: the entropy controller's prior.

The controller's choice k* = argmax (1 + sum pi_m) / (k C_d + C_v(k)) is only as good as its costs.
Measured online from a few single rounds, C_v(k)'s slope is noise on a shared CPU. Instead, one
untimed generation on the real prompt cycles k through `ks`, `repeats` times, and the medians become
the controller's starting costs (`generate(..., cost_prior=profile)`), refined online from there:

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

import statistics
from collections import defaultdict
from dataclasses import dataclass

import torch

from sparsespec.api import generate
from sparsespec.controllers import CycleK
from sparsespec.controllers.acceptance import EntropyBins, judged
from sparsespec.engine.attention import DEFAULT_AR_ATTENTION
from sparsespec.engine.loop import is_batch
from sparsespec.errors import ConfigError
from sparsespec.methods import METHODS

DEFAULT_KS = CycleK.Options().ks
MIN_AR_STEPS = 4       # AR steps timed per thread count: a median that one slow step does not move
PLAIN_ROUNDS = MIN_AR_STEPS - 1   # k = 0 rounds per cycle: with the profile's last round, C_AR from >= MIN_AR_STEPS


@dataclass(frozen=True)
class CostProfile:
    """Measured costs of one setting (model, context, method): the median seconds of one draft step
    (C_d) and of one verification of k drafts plus the last token (C_v(k)), over repeated rounds, and
    of one round with no draft (C_AR: one AR step of this method, verification hooks included).

    The same rounds also say how drafts fare: the mean entropy of accepted drafts and of the first
    rejected draft of a round, and the share of judged drafts accepted (None when unseen)."""
    draft_step_s: float
    verify_s: dict[int, float]
    accepted_entropy: float | None = None
    rejected_entropy: float | None = None
    acceptance_rate: float | None = None
    bins: EntropyBins | None = None
    ar_step_s: float | None = None     # C_AR: median whole k = 0 round (None: the profile ran none)
    select_s: float | None = None      # C_s: median KV selection of a drafting round (None: not measured)

    def as_dict(self) -> dict:
        return {"draft_step_s": self.draft_step_s, "verify_s": {str(k): v for k, v in sorted(self.verify_s.items())},
                "ar_step_s": self.ar_step_s, "select_s": self.select_s,
                "accepted_entropy": self.accepted_entropy, "rejected_entropy": self.rejected_entropy,
                "acceptance_rate": self.acceptance_rate,
                "bins": None if self.bins is None else {"accepted": self.bins.accepted, "judged": self.bins.judged}}


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
                        ar_attention=ar_attention, threads=torch.get_num_threads(), **profile_options)
    else:
        gens = generate(model, prompts, prefilled=prefilled, stop_at_eos=False, ar_attention=ar_attention,
                        threads=torch.get_num_threads())
    return profile_of(full_batch_rounds(gens))


def full_batch_rounds(gens) -> list:
    """The rounds of a batched generation that every sequence took part in. A sequence that finishes
    leaves the batch, and the rounds after verify fewer rows: counted, they would make C_v(k) look
    cheap (a round of the last few sequences costs a fraction of the whole batch's)."""
    together = min(len(g.rounds) for g in gens)
    return [r for g in gens for r in g.rounds[:together]]


def profile_of(rounds) -> CostProfile:
    """Median C_d and C_v(k) of measured rounds (`Round`s)."""
    verify = defaultdict(list)
    for r in rounds:
        if r.drafted:
            verify[r.drafted].append(r.verify_s)
    steps = [r.draft_s / r.draft_steps for r in rounds if r.draft_steps]
    if not steps or not verify:
        raise ConfigError("the cost profile drafted nothing: the method proposed no tokens on this prompt")
    accepted, rejected, bins = [], [], EntropyBins()
    for r in rounds:
        taken, refused = judged(r.entropies, r.accepted, r.drafted)
        accepted += taken
        rejected += [] if refused is None else [refused]
        bins.add_round(r.entropies, r.accepted, r.drafted)
    n_judged = len(accepted) + len(rejected)
    plain = [r.seconds for r in rounds if not r.drafted and not r.draft_steps]
    return CostProfile(draft_step_s=statistics.median(steps), ar_step_s=statistics.median(plain) if plain else None,
                       select_s=statistics.median(r.select_s for r in rounds if r.draft_steps),
                       verify_s={k: statistics.median(v) for k, v in sorted(verify.items())},
                       accepted_entropy=statistics.fmean(accepted) if accepted else None,
                       rejected_entropy=statistics.fmean(rejected) if rejected else None,
                       acceptance_rate=len(accepted) / n_judged if n_judged else None,
                       bins=bins if n_judged else None)
