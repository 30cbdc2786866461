"""A cost profile: what a generation's measured rounds say about this setting's costs and drafts, the
entropy controller's prior (`Controller.use_cost_prior`).

    C_d    = median over draft steps of (draft seconds / draft steps)
    C_v(k) = median over the rounds that verified k drafts of their verify seconds
    C_s    = median over the rounds with a draft of their KV-selection seconds
    C_AR   = median over the rounds with no draft of their whole seconds (one AR step of this method,
             as the fallback rule counts a round)
    mu_acc, mu_rej, rate, bins: the entropies and acceptance of the judged drafts

Two sources: the harness's untimed calibration cycle (sparsespec/calibration.py), and an earlier
`generate` call on the same model (sparsespec/call_memory.py), whose rounds are `profile_of`'d
and `merged` over what calls before it measured.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass

from sparsespec.controllers.acceptance import EntropyBins, judged
from sparsespec.errors import ConfigError


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


def drafted_any(rounds) -> bool:
    """Whether `profile_of(rounds)` has what it needs: a round that drafted and verified drafts."""
    return any(r.drafted and r.draft_steps for r in rounds)


def merged(older: CostProfile | None, newer: CostProfile) -> CostProfile:
    """`newer`, with what only `older` measured kept: C_AR, C_s or the acceptance where `newer` has
    none, and C_v(k) at the k `newer` did not verify while `newer` verified fewer than two (a line
    needs two points; beyond that, older points describe an earlier state of the machine, and a
    profile's points never leave the fit)."""
    if older is None:
        return newer
    kept = {f.name: getattr(older, f.name) for f in dataclasses.fields(CostProfile)
            if getattr(newer, f.name) is None}
    verify_s = newer.verify_s if len(newer.verify_s) >= 2 else {**older.verify_s, **newer.verify_s}
    return dataclasses.replace(newer, verify_s=verify_s, **kept)
