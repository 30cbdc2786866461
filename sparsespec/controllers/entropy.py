"""SparseSpec-L's entropy controller: k chosen each round from the draft entropies and measured costs.

Entropy centres. mu_acc and mu_rej are exponential moving averages of the draft entropy H of
accepted tokens and of the first rejected token of a round (later tokens of a rejected round were
never judged, so they update neither):  mu <- (1 - ema) * mu + ema * H, per token; the first
observation initialises a centre.

Acceptance probability p_i, `acceptance_model` (sparsespec/controllers/acceptance.py):
- "paper" (the paper's form, replaceable via `acceptance_fn`): a two-class softmax over negative
  L1 distances to the centres, tau = 1;
- "binned" (default): the measured acceptance of drafts of similar entropy, each 0.5-nat bin shrunk
  towards the overall acceptance rate. The paper's form assumes a draft far from the accepted
  centre is likely rejected; where high-entropy drafts are still often accepted, it under-drafts.
  The centres are still kept (traces, the "paper" model).

Choice (sparsespec/controllers/cost_models.py): k* = argmax_{k in K} R(k),
    R(k) = (1 + sum_{m<=k} pi_m) / (k * C_d + C_v(k) + C_s),   pi_m = prod_{i<=m} p_i,
C_s the round's KV selection (measured as a round's seconds beyond its draft and verification), so
the denominator is the whole round the fallback rule measures.

Deciding online. H_i is known only once token i is drafted. R is unimodal in k: writing
g(k) = k*C_d + C_v(k) (affine, slope C_d' = C_d + c_v), R(k+1) is the mediant of R(k) and
pi_{k+1}/C_d', and pi is non-increasing, so once R stops rising it never rises again. Hence the
exact online rule, which returns the closed form's k* for the same entropies:
  after drafting token j (p_1..p_j known):
    1. if j is a candidate: if R(j) <= R(best) stop (the closed form's k* is `best`); else best = j;
    2. if j = max(K) or j = limit: stop and submit `best`;
    3. bound: every later token has pi <= pi_j, so for the next candidate k',
       R(k') <= (1 + S_j + (k'-j) pi_j) / g(k'); if that is <= R(best), stop now and submit `best`
       without paying for a draft step that cannot help;
    4. otherwise draft token j+1.
  Before the first candidate (j < min K) drafting always continues.
What is submitted when drafting stops at j > best: the closed form's k* = best discards the drafted
tokens after it, though their draft steps are paid. `keep_drafted` (default) submits instead the
candidate c <= j with the largest R_paid(c; j) = (1 + sum_{m<=c} pi_m) / (j C_d + C_v(c) + C_s):
a drafted token goes to verification when its expected tokens outweigh its share of verification
(with a flat C_v, always). Drafting decisions, and so draft steps, are the rule's either way.

A batch drafts one k for all its sequences: R(k) = sum_b (1 + sum_{m<=k} pi^b_m) / (k C_d + C_v(k)),
i.e. the same rule on the batch's mean survival pibar_m = mean_b pi^b_m (non-increasing, so the
unimodality argument holds). One sequence is a batch of one: pibar = pi.

Warm-up and degenerate cases. Until `warmup_rounds` rounds are done and both centres exist, the
controller drafts the prior k, cycling through `warmup_k` (small first, growing) so that C_v's slope
in k is measured. With the fallback on and no cost profile, a generation opens with an AR step
("ar_probe": C_AR), and after each warm-up round the rule asks whether speculation can pay at all:
with the costs measured so far (C_d, C_v, C_s) and the optimistic acceptance rate u (below), if no
k <= max(K) reaches R(k) >= `fallback_margin` / C_AR, with pi_m = u^m, the warm-up ends and hands
over to the fallback at once, so a loaded machine pays for one warm-up round, not four.

Optimism. A warm-up or a probe has judged a handful of drafts, and the rate they show (Laplace's
(n_acc + 1) / (n_judged + 2)) is mostly luck: a 4K prompt whose drafts are accepted 80% of the time
has its first draft rejected one time in five. Judged at that rate, at the round's own small k (whose
selection and verification cost as much as ~3 AR steps on a 2-core CPU), the first warm-up round
handed over unless every draft was accepted, and each probe after it drafted k = 1, whose round
cannot beat AR even when its draft is accepted. So both are judged at u, the `optimism` quantile
(0.9) of the rate's Beta(n_acc + 1, n_rej + 1) posterior: exploration asks whether speculation
could pay, and the fallback's full window, on measured rounds, decides whether it does.
When |mu_acc - mu_rej| < `min_separation`, entropy says nothing, so it keeps the prior k. While
one centre is still unseen (no rejection yet, or no acceptance yet), p_i is Laplace's rule of
succession on the counts: (n_acc + 1) / (n_acc + 2), or 1 / (n_rej + 2).

Costs. C_d is an EMA of measured draft-step seconds; C_v(k) is fitted (`verify_cost_fit`: a line,
or the lower convex hull) through an EMA of measured verify seconds per submitted k; a point unmeasured for
more than `verify_point_age` rounds leaves the fit (or returns to its cost profile's value), so a k once
timed in other conditions cannot keep k from growing (cost_models.py). Times come
synchronised from the decode loop.

Plain decoding (`fallback`, sparsespec/controllers/fallback.py). k = 0 is a candidate too: one AR
step, one token per sequence for C_AR seconds. Once the rule is in charge, each round first asks
whether speculation is predicted to yield fewer tokens per second than AR, from robust (median)
costs of recent rounds: then the round is an AR step ("fallback"), the drafter is not called, and
every so often a "probe" round (k <= `prior_k`) re-measures speculation so that it returns when the
load drops or acceptance rises. A probe drafts a fixed k: the candidate k <= `prior_k` with the
largest R(k) at the optimistic rate u (prior_k while costs are unmeasured). Rounds are compared whole (selection, every draft step, verification),
and speculation must lose by `fallback_margin` over a full window. The first such round measures
C_AR ("ar_probe") unless the cost profile brings it. Each round's trace records the choice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from scipy.special import betaincinv   # the Beta quantile; imported with the module, not inside a timed round

from sparsespec.options import OptionSet, above, at_least, in_range, non_empty, one_of, option
from sparsespec.controllers.acceptance import EntropyBins, judged, paper_acceptance, with_base_rate
from sparsespec.controllers.base import Controller
from sparsespec.controllers.cost_models import HullCostModel, LinearCostModel, choose_k, expected_ratio, survival
from sparsespec.controllers.fallback import AR_PROBE, PLAIN, PROBE, PlainFallback


class EntropyController(Controller):
    """The entropy controller (module docstring); one class for a sequence and for a batch."""

    name = "entropy"
    uses_entropy = True
    reads_costs = True

    @dataclass(frozen=True)
    class Options(OptionSet):
        candidates: tuple[int, ...] = option(tuple(range(1, 17)), "every k up to 16: the paper's fixed-k sweep stops there",
                                             check=non_empty(at_least(1)))
        prior_k: int = option(4, "drafted while entropy cannot yet discriminate, and the most a probe drafts: "
                                 "the fixed controller's k", check=at_least(1))
        warmup_k: tuple[int, ...] = option((2, 4, 8), "cycled in warm-up so that C_v's slope in k is measured; "
                                                      "small first, so a losing first round costs little",
                                           check=non_empty(at_least(1)))
        warmup_rounds: int = option(4, "rounds of measurement before the online rule takes over", check=at_least(0))
        ema_entropy: float = option(0.1, "~10-token memory for the accepted / rejected entropy centres",
                                    check=in_range(0, 1, high_open=False))
        ema_cost: float = option(0.2, "~5-round memory for the measured draft and verify costs",
                                 check=in_range(0, 1, high_open=False))
        tau: float = option(1.0, "the paper's softmax over plain L1 distances", check=above(0))
        min_separation: float = option(0.05, "nats; closer centres say nothing, so the prior k stays", check=at_least(0))
        prior_strength: float = option(16.0, "judged drafts a cost profile's acceptance evidence counts for: "
                                                   "about a prompt's first 4 rounds, then this prompt's own decide",
                                       check=at_least(0))
        acceptance_model: str = option("binned", "binned: measured acceptance by entropy bin; paper: the "
                                                 "paper's two-centre softmax (under-drafts when high-entropy "
                                                 "drafts are still often accepted)",
                                       check=one_of("binned", "paper"))
        acceptance_prior: bool = option(True, "weigh p_i by the measured acceptance rate (false: the paper's "
                                              "equal-prior form, which under-drafts at high acceptance)")
        verify_cost_fit: str = option("line", "line: least squares through every recently measured k (C_v affine in k, "
                                                "the paper's cost model); hull: the measured points' lower convex hull",
                                      check=one_of("line", "hull"))
        verify_point_age: int = option(16, "rounds past its last measurement a C_v(k) point stays in the fit: ~3 EMA "
                                           "memories; an older one describes another machine state "
                                           "(threads, load) and can freeze k", check=at_least(1))
        lookahead: str = option("predict", "predict: stop before a draft step expected to lose; exact: the "
                                           "closed form's k, paying for one discarded step", check=one_of("predict", "exact"))
        fallback: bool = option(True, "k = 0 (one AR step) is a candidate, taken while speculation is predicted "
                                      "slower than AR (a loaded machine); false: the paper's rule, k >= 1 always")
        cost_window: int = option(5, "recent rounds each fallback cost median spans: one slow round of 5 is "
                                     "ignored, a lasting change decides within 3", check=at_least(1))
        probe_every: int = option(8, "AR rounds before speculation is first re-probed: a probe is at most one "
                                     "round in 9", check=at_least(1))
        probe_max: int = option(64, "the longest wait between probes while speculation keeps losing: probes "
                                    "then cost at most one round in 65", check=at_least(1))
        keep_drafted: bool = option(True, "a drafted token's step is paid: submit it when its expected tokens "
                                          "outweigh its extra verification (false: the closed form's k*, "
                                          "discarding the tokens drafted past it)")
        optimism: float = option(0.9, "warm-ups and probes judge speculation at this quantile of the acceptance "
                                      "rate's posterior: a few drafts say little, and an unlucky first rejection "
                                      "must not end speculation that pays", check=in_range(0.5, 1))
        fallback_margin: float = option(0.95, "fall back only when speculation's rate is below 0.95 x AR's: "
                                              "medians of a few rounds are a few percent noisy, and a wrong "
                                              "fallback forgoes the whole speed-up", check=in_range(0, 1, high_open=False))

    def __init__(self, acceptance_fn: Callable[..., float] = paper_acceptance, **options):
        super().__init__(**options)
        o = self.opts
        self.candidates = sorted(set(o.candidates))
        self.prior_k = o.prior_k                   # k used while entropy cannot yet discriminate
        self.warmup_k = list(o.warmup_k)           # warm-up cycles these, so C_v's slope is measured
        self.warmup_rounds = o.warmup_rounds
        self.ema_entropy = o.ema_entropy
        self.ema_cost = o.ema_cost
        self.tau = o.tau
        self.min_separation = o.min_separation
        self.acceptance_prior = o.acceptance_prior
        self.acceptance_fn = acceptance_fn
        self.lookahead = o.lookahead
        self.prior_strength = o.prior_strength
        self.acceptance_model = o.acceptance_model
        self.bins = EntropyBins()
        self._max_k = max(self.candidates + [self.prior_k] + self.warmup_k)
        self.mu_acc: float | None = None
        self.mu_rej: float | None = None
        self.c_draft: float | None = None
        self.c_select: float | None = None         # C_s: seconds of a round's KV selection (EMA; None: unmeasured, 0)
        self.keep_drafted = o.keep_drafted
        self.c_verify = (HullCostModel if o.verify_cost_fit == "hull" else LinearCostModel)(
            ema=o.ema_cost, max_age=o.verify_point_age)
        self.rounds_seen = 0
        self.warmup_seen = 0                       # warm-up rounds run (the ar_probe not counted)
        self.n_accepted = self.n_rejected = 0.0    # judged drafts accepted / rejected (profile pseudo-counts included)
        self.optimism = o.optimism
        self.plain = PlainFallback(o.cost_window, o.probe_every, o.probe_max, o.fallback_margin) if o.fallback else None
        self._reset_round(limit=self.max_k)

    @property
    def max_k(self) -> int:
        return self._max_k

    def use_cost_prior(self, profile) -> None:
        """Measured C_d and C_v(k) (a `sparsespec.controllers.cost_profile.CostProfile`) replace the warm-up: the
        rule is in charge from round one and refines the costs online (the EMAs start from the profile).
        The profile's C_AR, when measured, seeds the fallback's AR window: no `ar_probe` round."""
        self.c_draft = profile.draft_step_s
        if profile.select_s is not None:
            self.c_select = profile.select_s
        for k, seconds in profile.verify_s.items():
            self.c_verify.seed(int(k), seconds)
        if self.plain is not None and profile.ar_step_s is not None:
            self.plain.seed_ar(profile.ar_step_s)
        self.warmup_rounds = 0
        self.use_acceptance_prior(profile)

    def use_acceptance_prior(self, profile) -> None:
        """Start the entropy centres and the acceptance counts from the profile's rounds, worth
        `prior_strength` judged drafts, instead of Laplace's 1/2 (which opens every prompt at k = 1).
        This prompt's own rounds move the centres (EMA) and outweigh the counts within a few rounds."""
        if self.prior_strength <= 0 or profile.acceptance_rate is None:
            return
        self.mu_acc = profile.accepted_entropy
        self.mu_rej = profile.rejected_entropy
        self.n_accepted = profile.acceptance_rate * self.prior_strength
        self.n_rejected = (1.0 - profile.acceptance_rate) * self.prior_strength
        if profile.bins is not None:
            self.bins = profile.bins.scaled(self.prior_strength)

    # --- state ------------------------------------------------------------------------------
    def _reset_round(self, limit: int) -> None:
        self._limit = limit
        self._fixed: int | None = None
        self._probs: list[float] = []              # pibar's ratios p_j = pibar_j / pibar_{j-1}
        self._seq_survival: list[float] = []       # pi^b_j of each sequence (a batch of more than one)
        self._best_k, self._best_r = 0, -math.inf
        self._steps = 0                            # draft steps run this round
        self._submit: int | None = None
        self._choice = ""                          # the fallback rule's choice ("": it did not choose)
        self._warmup = False                       # a round drafted before the rule is in charge

    @property
    def ready(self) -> bool:
        """Costs are measured and entropy can discriminate: the online rule is in charge."""
        if self.warmup_seen < self.warmup_rounds or self.c_draft is None or not self.c_verify.by_k:
            return False
        if self.acceptance_model == "binned":
            return True
        centres_equal = (self.mu_acc is not None and self.mu_rej is not None
                         and abs(self.mu_acc - self.mu_rej) < self.min_separation)
        return not centres_equal

    def acceptance_rate(self) -> float:
        """Judged drafts accepted so far, by Laplace's rule of succession: (n_acc + 1) / (n_judged + 2)."""
        return (self.n_accepted + 1) / (self.n_accepted + self.n_rejected + 2)

    def acceptance(self, entropy: float) -> float:
        """p_i. With one centre still unseen (never a rejection, or never an acceptance), entropy
        cannot be compared, and Laplace's rule of succession on the counts stands in. The binned
        model shrinks each bin towards that same overall rate."""
        rate = self.acceptance_rate()
        if self.acceptance_model == "binned":
            return self.bins.acceptance(entropy, rate)
        if self.mu_rej is None:
            return (self.n_accepted + 1) / (self.n_accepted + 2)
        if self.mu_acc is None:
            return 1 / (self.n_rejected + 2)
        p = self.acceptance_fn(entropy, self.mu_acc, self.mu_rej, self.tau)
        if not self.acceptance_prior:
            return p
        return with_base_rate(p, rate)

    # --- the round protocol -----------------------------------------------------------------
    def start_round(self, limit: int) -> int:
        self._reset_round(limit)
        plain = self.plain if limit > 0 else None
        if plain is not None and plain.cost_ar() is None:
            self._choice, self._fixed = AR_PROBE, 0          # C_AR first: what every later round is judged by
            return 0
        if plain is not None and (self.ready or plain.falling_back):   # falling back unready: the warm-up lost
            self._choice = plain.choose()
            if self._choice in PLAIN:
                self._fixed = 0                     # no draft: one AR step
                return 0
            if self._choice == PROBE:                    # a fixed, bounded k (module docstring)
                self._limit = self._fixed = self.probe_k(min(limit, self.prior_k))
            return self._limit
        if limit <= 0 or not self.ready:
            self._warmup = limit > 0
            if self.warmup_seen < self.warmup_rounds and self.warmup_k:
                k = self.warmup_k[self.warmup_seen % len(self.warmup_k)]
            else:
                k = self.prior_k
            self._fixed = min(k, limit)
            return self._fixed
        return self._limit

    def keep_drafting_batch(self, entropies: Sequence[Sequence[float]]) -> bool:
        """After draft token j of every sequence: the online rule on pibar (module docstring)."""
        j = self._steps = len(entropies[0])
        if self._fixed is not None:
            return j < self._fixed
        ps = [self.acceptance(float(seq[-1])) for seq in entropies]   # one sync per sequence and draft step
        self._probs.append(ps[0] if len(ps) == 1 else self._mean_survival_ratio(ps))
        return self._decide()

    def _mean_survival_ratio(self, ps: list[float]) -> float:
        """p_j = pibar_j / pibar_{j-1}, pibar_j = mean_b pi^b_j, with pi^b_j = pi^b_{j-1} * ps[b]."""
        before = self._seq_survival or [1.0] * len(ps)
        self._seq_survival = [s * p for s, p in zip(before, ps)]
        pibar_before, pibar = sum(before) / len(ps), sum(self._seq_survival) / len(ps)
        return pibar / pibar_before if pibar_before > 0 else 0.0

    def _decide(self) -> bool:
        """The online rule after draft token j = len(_probs) (module docstring)."""
        j = len(self._probs)
        pis = survival(self._probs)
        if j in self.candidates:
            r = expected_ratio(pis, j, self.c_draft, self.c_verify, self.c_select or 0.0)
            if r <= self._best_r:
                self._submit = self._paid_choice(pis, j)
                return False
            self._best_k, self._best_r = j, r
        if j >= self._limit or j >= self.candidates[-1]:
            self._submit = self._paid_choice(pis, j) or j   # a limit below min(K) still verifies what was drafted
            return False
        nxt = next((k for k in self.candidates if k > j), None)
        if self._best_k and nxt is not None:
            # later tokens' pi: at most pi_j ("exact"), or pi_j * p_j^t if p stays at p_j ("predict")
            p_next = 1.0 if self.lookahead == "exact" else self._probs[-1]
            later = sum(pis[-1] * p_next ** t for t in range(1, nxt - j + 1))
            bound = (1.0 + sum(pis) + later) / (nxt * self.c_draft + self.c_verify(nxt) + (self.c_select or 0.0))
            if bound <= self._best_r:
                self._submit = self._paid_choice(pis, j)
                return False
        return True

    def _paid_choice(self, pis: list[float], j: int) -> int:
        """What to submit when drafting stops after token j: the closed form's `best`, or with
        `keep_drafted` the candidate c in [best, j] maximising R_paid(c; j) (module docstring; ties to
        the smaller c); 0 if no candidate was reached."""
        if not self.keep_drafted or not self._best_k:
            return self._best_k
        paid = [c for c in self.candidates if self._best_k <= c <= j]
        c_s = self.c_select or 0.0
        return max(paid, key=lambda c: (expected_ratio(pis, c, self.c_draft, self.c_verify, c_s, steps=j), -c))

    def submit_count(self, drafted: int) -> int:
        if self._fixed is not None or self._submit is None:
            return drafted
        return min(self._submit, drafted)

    def observe_batch(self, entropies, accepted, submitted, draft_step_s, verify_s, round_s=None) -> None:
        """Every sequence's tokens update the entropy centres and counts; the round count and the
        costs (the batch's) update once. The fallback rule weighs the whole round's seconds
        (`round_s`; without it, k C_d + C_v(k))."""
        self.rounds_seen += 1
        for seq_entropies, a in zip(entropies, accepted):
            self._learn(seq_entropies, a, submitted)
        self._learn_costs(submitted, draft_step_s, verify_s, round_s)
        if self.plain is not None:
            tokens = sum(a + 1 for a in accepted) / len(accepted) if accepted else 1.0   # per sequence
            if round_s is None:
                round_s = submitted * (draft_step_s or 0.0) + verify_s                  # k C_d + C_v(k)
            self.plain.observe(self._choice, submitted, tokens, round_s)
            if self._warmup and submitted and self.warmup_loses():
                self.warmup_rounds = self.warmup_seen + 1   # the rule takes over, in fallback
                self.plain.fall_back()
        self.warmup_seen += self._warmup

    def optimistic_rate(self) -> float:
        """u: the `optimism` quantile of the acceptance rate's Beta(n_acc + 1, n_rej + 1) posterior
        (module docstring)."""
        return float(betaincinv(self.n_accepted + 1, self.n_rejected + 1, self.optimism))

    def best_optimistic(self, bound: int) -> tuple[int, float]:
        """(k, R(k)) of the candidate k <= bound with the largest R at the optimistic rate (ties to
        the smaller k), on the costs measured so far; (bound, inf) while C_d or C_v is unmeasured."""
        if self.c_draft is None or not self.c_verify.by_k:
            return bound, math.inf
        probs, c_select = [self.optimistic_rate()] * bound, self.c_select or 0.0
        k = choose_k(probs, self.candidates, self.c_draft, self.c_verify, c_select)
        if k is None:                                    # no candidate <= bound
            return bound, math.inf
        return k, expected_ratio(survival(probs), k, self.c_draft, self.c_verify, c_select)

    def probe_k(self, bound: int) -> int:
        return self.best_optimistic(bound)[0]

    def warmup_loses(self) -> bool:
        """No k could beat AR at the measured costs even at the optimistic rate (module docstring),
        with C_AR measured."""
        c_ar = self.plain.cost_ar()
        if c_ar is None:
            return False
        return self.best_optimistic(self.max_k)[1] < self.plain.margin / c_ar

    def _learn(self, entropies: Sequence[float], accepted: int, submitted: int) -> None:
        self.n_accepted += accepted
        self.n_rejected += int(accepted < submitted)
        self.bins.add_round(entropies, accepted, submitted)
        taken, rejected = judged(entropies, accepted, submitted)
        for h in taken:
            self.mu_acc = h if self.mu_acc is None else (1 - self.ema_entropy) * self.mu_acc + self.ema_entropy * h
        if rejected is not None:
            h = rejected
            self.mu_rej = h if self.mu_rej is None else (1 - self.ema_entropy) * self.mu_rej + self.ema_entropy * h

    def _learn_costs(self, submitted: int, draft_step_s: float | None, verify_s: float, round_s: float | None) -> None:
        self.c_verify.tick()
        if draft_step_s is not None:
            self.c_draft = draft_step_s if self.c_draft is None else \
                (1 - self.ema_cost) * self.c_draft + self.ema_cost * draft_step_s
            if round_s is not None:                 # C_s: the round beyond its draft steps and verification
                select_s = max(0.0, round_s - self._steps * draft_step_s - verify_s)
                self.c_select = select_s if self.c_select is None else \
                    (1 - self.ema_cost) * self.c_select + self.ema_cost * select_s
        if submitted:                               # a round without drafts is C_AR, not a point of C_v(k)
            self.c_verify.add(submitted, verify_s)

    def trace(self) -> dict:
        choice = {"choice": self._choice, "cost_ar": self.plain.cost_ar()} if self._choice else {}
        if self._fixed is not None:
            return choice
        k = self._submit if self._submit is not None else len(self._probs)
        return {"accept_probs": self._probs[:k], "survival": survival(self._probs[:k]),
                "cost_draft": self.c_draft, "cost_verify": self.c_verify(k), "cost_select": self.c_select, **choice}
