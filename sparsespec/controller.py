"""How many tokens to draft each round: a fixed k, or SparseSpec-L's entropy controller.

The decode loop talks to a controller through four calls:
    start_round(limit)            -> a new round; at most `limit` tokens may be drafted
    keep_drafting(entropies)      -> after each draft token (its entropy known): draft another?
    submit_count(drafted)         -> how many of the drafted tokens go to verification
    observe(entropies, accepted, submitted, draft_step_s, verify_s) -> what verification decided
and `trace()` returns what the controller believed this round (p_i, pi_m, C_d, C_v), for `Round`.

Entropy controller
------------------
Entropy centres. mu_acc and mu_rej are exponential moving averages of the draft entropy H of
accepted tokens and of the first rejected token of a round (later tokens of a rejected round were
never judged, so they update neither):  mu <- (1 - ema) * mu + ema * H, per token; the first
observation initialises a centre.

Acceptance probability, `acceptance_model`:
- "paper" (the paper's form, replaceable via `acceptance_fn`): a two-class softmax over negative
  L1 distances to the centres,
    p_i = exp(-|H_i - mu_acc|/tau) / (exp(-|H_i - mu_acc|/tau) + exp(-|H_i - mu_rej|/tau)), tau = 1;
- "binned" (default): the measured acceptance of drafts of similar entropy. Judged drafts are
  counted in 0.5-nat entropy bins; p_i = (a_b + s * rate) / (n_b + s) for H_i's bin b, shrunk
  towards the overall acceptance rate with s = 4 pseudo-drafts. The paper's form assumes a draft
  far from the accepted centre is likely rejected; measured here (SmolLM2, 8K, fixed k) drafts at
  3-5.5 nats were still accepted 62-88% of the time, where the two-centre form says 7-50%, so it
  under-drafts. The centres are still kept (traces, the "paper" model).

Choice. With survival pi_m = prod_{i<=m} p_i and costs C_d (one draft step) and
C_v(k) = C_v0 + k * c_v (one verification of k drafts plus the last token),
    R(k) = (1 + sum_{m<=k} pi_m) / (k * C_d + C_v(k)),     k* = argmax_{k in K} R(k)
(the 1 counts the token verification always adds; ties go to the smaller k).

Deciding online. H_i is known only once token i is drafted. R is unimodal in k: writing
g(k) = k*C_d + C_v(k) (affine, slope C_d' = C_d + c_v), R(k+1) is the mediant of R(k) and
pi_{k+1}/C_d', and pi is non-increasing, so once R stops rising it never rises again. Hence the
exact online rule, which returns the closed form's k* for the same entropies:
  after drafting token j (p_1..p_j known):
    1. if j is a candidate: if R(j) <= R(best) stop and submit `best` (the drafted token j, and
       any after `best`, are discarded); else best = j;
    2. if j = max(K) or j = limit: stop and submit `best`;
    3. bound: every later token has pi <= pi_j, so for the next candidate k',
       R(k') <= (1 + S_j + (k'-j) pi_j) / g(k'); if that is <= R(best), stop now and submit `best`
       without paying for a draft step that cannot help;
    4. otherwise draft token j+1.
  Before the first candidate (j < min K) drafting always continues.

Warm-up and degenerate cases. Until `warmup_rounds` rounds are done and both centres exist, the
controller drafts the prior k, cycling through `warmup_k` so that C_v's slope in k is measured.
When |mu_acc - mu_rej| < `min_separation`, entropy says nothing, so it keeps the prior k. While
one centre is still unseen (no rejection yet, or no acceptance yet), p_i is Laplace's rule of
succession on the counts: (n_acc + 1) / (n_acc + 2), or 1 / (n_rej + 2).

Costs. C_d is an EMA of measured draft-step seconds. C_v(k) comes from an EMA of measured verify
seconds per submitted k, `verify_cost_fit`:
- "line" (default): a least-squares line through them (two or more distinct k), else a flat line at
  the one measured value; its slope is never negative and its intercept never below 0 (then the
  line is refitted through the origin), so no k is predicted free;
- "hull": the lower convex hull of the measured points, flat left of its first point and never
  below it: exact at the smallest k and at every k where the measured costs bend upwards. Measured
  C_v(k) is convex in k (batched attention over many rows grows faster than linearly on a CPU), and
  a line through k = 1..16 then predicts the small k too cheap (SmolLM2 8K, B = 8: C_v(1) predicted
  0.31 s, measured 0.40-0.52 s, and the controller sat at k = 1). A convex C_v keeps R(k) unimodal
  (a concave numerator over a convex denominator), so the online rule below stays exact.
Times come synchronised from the decode loop.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Sequence

from .errors import ConfigError
from .options import OptionSet, above, at_least, in_range, non_empty, one_of, option


def paper_acceptance(entropy: float, mu_acc: float, mu_rej: float, tau: float = 1.0) -> float:
    """p = softmax over the negative L1 distances of H to the accepted and rejected centres."""
    a = math.exp(-abs(entropy - mu_acc) / tau)
    r = math.exp(-abs(entropy - mu_rej) / tau)
    return a / (a + r)


def with_base_rate(p: float, rate: float) -> float:
    """Bayes' rule with a prior: p is the posterior under equal class priors (the paper's form);
    reweight it by the prior odds rate / (1 - rate) of a judged draft token being accepted."""
    return rate * p / (rate * p + (1.0 - rate) * (1.0 - p))


def survival(probs: Sequence[float]) -> list[float]:
    """pi_m = prod_{i<=m} p_i."""
    out, acc = [], 1.0
    for p in probs:
        acc *= p
        out.append(acc)
    return out


def expected_ratio(pis: Sequence[float], k: int, c_draft: float, c_verify: Callable[[int], float]) -> float:
    """R(k) = (1 + sum_{m<=k} pi_m) / (k C_d + C_v(k))."""
    return (1.0 + sum(pis[:k])) / (k * c_draft + c_verify(k))


def choose_k(probs: Sequence[float], candidates: Sequence[int], c_draft: float,
             c_verify: Callable[[int], float]) -> int:
    """Closed form: argmax over candidates (<= len(probs)) of R(k); ties to the smaller k."""
    pis = survival(probs)
    best_k, best_r = None, -math.inf
    for k in sorted(candidates):
        if k > len(pis):
            break
        r = expected_ratio(pis, k, c_draft, c_verify)
        if r > best_r:
            best_k, best_r = k, r
    return best_k


ENTROPY_BIN_NATS = 0.5     # bin width: ~12 bins over the 0-6 nats drafts span, each filled within a few prompts
ENTROPY_BINS = 12         # the last bin is open: everything above 5.5 nats
BIN_SHRINKAGE = 4.0       # pseudo-drafts at the overall rate: a bin's own rate takes over after a handful


def judged(entropies: Sequence[float], accepted: int, submitted: int) -> tuple[list[float], float | None]:
    """What verification judged of a round's drafts: the entropies of the accepted ones, and that of
    the first rejected one (None when all were accepted); drafts after it were never judged."""
    rejected = entropies[accepted] if accepted < submitted and accepted < len(entropies) else None
    return list(entropies[:accepted]), rejected


def entropy_bin(entropy: float) -> int:
    return min(max(int(entropy / ENTROPY_BIN_NATS), 0), ENTROPY_BINS - 1)


@dataclass
class EntropyBins:
    """Judged drafts counted by entropy bin: `accepted[b]` of `judged[b]` were accepted."""
    accepted: list[float] = field(default_factory=lambda: [0.0] * ENTROPY_BINS)
    judged: list[float] = field(default_factory=lambda: [0.0] * ENTROPY_BINS)

    def add(self, entropy: float, accepted: bool, weight: float = 1.0) -> None:
        b = entropy_bin(entropy)
        self.judged[b] += weight
        self.accepted[b] += weight * accepted

    def add_round(self, entropies: Sequence[float], accepted: int, submitted: int) -> None:
        """Count what verification judged of one round (`judged`)."""
        taken, rejected = judged(entropies, accepted, submitted)
        for h in taken:
            self.add(h, True)
        if rejected is not None:
            self.add(rejected, False)

    def acceptance(self, entropy: float, rate: float) -> float:
        b = entropy_bin(entropy)
        return (self.accepted[b] + BIN_SHRINKAGE * rate) / (self.judged[b] + BIN_SHRINKAGE)

    def scaled(self, weight: float) -> "EntropyBins":
        """The same shape of evidence, worth `weight` judged drafts in all."""
        total = sum(self.judged)
        f = weight / total if total else 0.0
        return EntropyBins([a * f for a in self.accepted], [n * f for n in self.judged])


CONTROLLERS: dict[str, type["Controller"]] = {}   # name -> class, filled as classes are defined


class Controller:
    """Base of every controller: declares `name`, its `Options` and whether it reads draft entropy.

    A new controller is one subclass here (registered by its `name`); no drafter or loop changes."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[OptionSet]]
    uses_entropy: ClassVar[bool] = False      # True: meaningless for drafters whose drafts have no entropy

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name:
            CONTROLLERS[cls.name] = cls

    def __init__(self, **options):
        self.opts = self.Options.build(options, owner=f"controller {self.name!r}")

    def use_cost_prior(self, profile: "CostProfile") -> None:
        """Start from measured costs (`sparsespec.calibration`); controllers that ignore costs ignore it."""

    # --- a batch (sparsespec/batch.py): one k for every sequence ---------------------------------
    def keep_drafting_batch(self, entropies: Sequence[Sequence[float]]) -> bool:
        """`entropies[b]`: sequence b's draft entropies this round (all the same length). A
        controller that does not read entropy decides on the count alone."""
        return self.keep_drafting(entropies[0])

    def observe_batch(self, entropies: Sequence[Sequence[float]], accepted: Sequence[int], submitted: int,
                      draft_step_s: float | None, verify_s: float) -> None:
        """What one batched verification decided, per sequence; the costs are the batch's. Count
        controllers learn from the batch's worst sequence (every draft accepted only if all were)."""
        self.observe(entropies[0] if entropies else [], min(accepted), submitted, draft_step_s, verify_s)


@dataclass(frozen=True)
class CostProfile:
    """Measured costs of one setting (model, context, method): the median seconds of one draft step
    (C_d) and of one verification of k drafts plus the last token (C_v(k)), over repeated rounds.

    The same rounds also say how drafts fare: the mean entropy of accepted drafts and of the first
    rejected draft of a round, and the share of judged drafts accepted (None when unseen)."""
    draft_step_s: float
    verify_s: dict[int, float]
    accepted_entropy: float | None = None
    rejected_entropy: float | None = None
    acceptance_rate: float | None = None
    bins: EntropyBins | None = None

    def as_dict(self) -> dict:
        return {"draft_step_s": self.draft_step_s, "verify_s": {str(k): v for k, v in sorted(self.verify_s.items())},
                "accepted_entropy": self.accepted_entropy, "rejected_entropy": self.rejected_entropy,
                "acceptance_rate": self.acceptance_rate,
                "bins": None if self.bins is None else {"accepted": self.bins.accepted, "judged": self.bins.judged}}


class FixedK(Controller):
    """Always draft k tokens (fewer only when the output budget ends)."""

    name = "fixed"

    @dataclass(frozen=True)
    class Options(OptionSet):
        k: int = option(4, "the best fixed k on this project's CPU benchmark at 4K-8K", check=at_least(1))

    def __init__(self, k: int | None = None, **options):
        super().__init__(**options, **({} if k is None else {"k": k}))
        self.k = self.opts.k
        self.max_k = self.k
        self._limit = self.k

    def start_round(self, limit: int) -> None:
        self._limit = min(self.k, limit)

    def keep_drafting(self, entropies: Sequence[float]) -> bool:
        return len(entropies) < self._limit

    def submit_count(self, drafted: int) -> int:
        return drafted

    def observe(self, entropies, accepted, submitted, draft_step_s, verify_s) -> None:
        pass

    def trace(self) -> dict:
        return {}


@dataclass
class LinearCostModel:
    """C_v(k) = a + b k, from an EMA of measured seconds per k."""
    ema: float = 0.2
    by_k: dict = field(default_factory=dict)

    def add(self, k: int, seconds: float) -> None:
        old = self.by_k.get(k)
        self.by_k[k] = seconds if old is None else (1 - self.ema) * old + self.ema * seconds

    def line(self) -> tuple[float, float] | None:
        if not self.by_k:
            return None
        ks, vs = list(self.by_k), list(self.by_k.values())
        if len(ks) == 1:
            return vs[0], 0.0
        mk, mv = sum(ks) / len(ks), sum(vs) / len(vs)
        b = sum((k - mk) * (v - mv) for k, v in zip(ks, vs)) / sum((k - mk) ** 2 for k in ks)
        b = max(b, 0.0)                      # verification never gets cheaper with more tokens
        if mv - b * mk < 0:                  # nor free: a steep line (one slow round) would predict
            b = sum(k * v for k, v in zip(ks, vs)) / sum(k * k for k in ks)   # C_v(1) < 0; refit through 0
            return 0.0, b
        return mv - b * mk, b

    def __call__(self, k: int) -> float:
        a, b = self.line()
        return a + b * k


@dataclass
class HullCostModel(LinearCostModel):
    """C_v(k) from the lower convex hull of the measured (k, EMA seconds) points: piecewise linear,
    convex, non-decreasing; flat left of the smallest measured k, the last slope right of the largest."""

    def hull(self) -> list[tuple[int, float]]:
        """The lower convex hull of the points, left to right (Andrew's monotone chain)."""
        out: list[tuple[int, float]] = []
        for k, v in sorted(self.by_k.items()):
            while len(out) >= 2 and (out[-1][0] - out[-2][0]) * (v - out[-2][1]) \
                    <= (out[-1][1] - out[-2][1]) * (k - out[-2][0]):      # out[-1] lies on or above the chord
                out.pop()
            out.append((k, v))
        return out

    def __call__(self, k: int) -> float:
        points = self.hull()
        if len(points) == 1:
            return points[0][1]
        segment = next((i for i in range(1, len(points)) if k <= points[i][0]), len(points) - 1)
        (k0, v0), (k1, v1) = points[segment - 1], points[segment]
        return max(points[0][1], v0 + (v1 - v0) * (k - k0) / (k1 - k0))   # non-decreasing: a convex hull
                                                                          # may dip before it rises


class EntropyController(Controller):
    name = "entropy"
    uses_entropy = True

    @dataclass(frozen=True)
    class Options(OptionSet):
        candidates: tuple[int, ...] = option(tuple(range(1, 17)), "every k up to 16: the paper's fixed-k sweep stops there",
                                             check=non_empty(at_least(1)))
        prior_k: int = option(4, "drafted while entropy cannot yet discriminate: the best fixed k here", check=at_least(1))
        warmup_k: tuple[int, ...] = option((4, 8), "cycled in warm-up so that C_v's slope in k is measured",
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
                                                 "paper's two-centre softmax (under-drafts on this CPU: see sparsespec/controller.py)",
                                       check=one_of("binned", "paper"))
        acceptance_prior: bool = option(True, "weigh p_i by the measured acceptance rate (false: the paper's "
                                              "equal-prior form, which under-drafts at high acceptance)")
        verify_cost_fit: str = option("line", "line: least squares through every measured k (C_v affine in k, "
                                                "the paper's cost model); hull: the measured points' lower convex hull",
                                      check=one_of("line", "hull"))
        lookahead: str = option("predict", "predict: stop before a draft step expected to lose; exact: the "
                                           "closed form's k, paying for one discarded step", check=one_of("predict", "exact"))

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
        self.max_k = max(self.candidates + [self.prior_k] + self.warmup_k)
        self.mu_acc: float | None = None
        self.mu_rej: float | None = None
        self.c_draft: float | None = None
        self.c_verify = (HullCostModel if o.verify_cost_fit == "hull" else LinearCostModel)(ema=o.ema_cost)
        self.rounds_seen = 0
        self.n_accepted = self.n_rejected = 0.0    # judged drafts accepted / rejected (profile pseudo-counts included)
        self._reset_round(limit=self.max_k)

    def use_cost_prior(self, profile: CostProfile) -> None:
        """Measured C_d and C_v(k) replace the warm-up: the rule is in charge from round one and
        refines the costs online (the EMAs start from the profile)."""
        self.c_draft = profile.draft_step_s
        for k, seconds in profile.verify_s.items():
            self.c_verify.by_k[int(k)] = seconds
        self.warmup_rounds = 0
        self.use_acceptance_prior(profile)

    def use_acceptance_prior(self, profile: CostProfile) -> None:
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
        self._probs: list[float] = []
        self._best_k, self._best_r = 0, -math.inf
        self._submit: int | None = None

    @property
    def ready(self) -> bool:
        """Costs are measured and entropy can discriminate: the online rule is in charge."""
        if self.rounds_seen < self.warmup_rounds or self.c_draft is None or not self.c_verify.by_k:
            return False
        if self.acceptance_model == "binned":
            return True
        centres_equal = (self.mu_acc is not None and self.mu_rej is not None
                         and abs(self.mu_acc - self.mu_rej) < self.min_separation)
        return not centres_equal

    def acceptance(self, entropy: float) -> float:
        """p_i. With one centre still unseen (never a rejection, or never an acceptance), entropy
        cannot be compared, and Laplace's rule of succession on the counts stands in. The binned
        model shrinks each bin towards that same overall rate."""
        rate = (self.n_accepted + 1) / (self.n_accepted + self.n_rejected + 2)
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
    def start_round(self, limit: int) -> None:
        self._reset_round(limit)
        if not self.ready:
            if self.rounds_seen < self.warmup_rounds and self.warmup_k:
                k = self.warmup_k[self.rounds_seen % len(self.warmup_k)]
            else:
                k = self.prior_k
            self._fixed = min(k, limit)

    def keep_drafting(self, entropies: Sequence[float]) -> bool:
        j = len(entropies)
        if self._fixed is not None:
            return j < self._fixed
        self._probs.append(self.acceptance(float(entropies[-1])))  # one sync per draft step
        return self._decide()

    def keep_drafting_batch(self, entropies: Sequence[Sequence[float]]) -> bool:
        """The batch rule: R(k) = sum_b (1 + sum_{m<=k} pi^b_m) / (k C_d + C_v(k)), i.e. the online
        rule on the batch's mean survival pibar_m = mean_b pi^b_m (non-increasing, so the rule's
        unimodality argument holds). `_probs` holds pibar's ratios p_j = pibar_j / pibar_{j-1},
        so the trace's `survival` is pibar."""
        j = len(entropies[0])
        if self._fixed is not None:
            return j < self._fixed
        pibar = sum(survival([self.acceptance(float(h)) for h in seq])[-1] for seq in entropies) / len(entropies)
        before = survival(self._probs)[-1] if self._probs else 1.0
        self._probs.append(pibar / before if before > 0 else 0.0)
        return self._decide()

    def _decide(self) -> bool:
        """The online rule after draft token j = len(_probs) (module docstring)."""
        j = len(self._probs)
        pis = survival(self._probs)
        if j in self.candidates:
            r = expected_ratio(pis, j, self.c_draft, self.c_verify)
            if r <= self._best_r:
                self._submit = self._best_k
                return False
            self._best_k, self._best_r = j, r
        if j >= self._limit or j >= self.candidates[-1]:
            self._submit = self._best_k or j      # a limit below min(K) still verifies what was drafted
            return False
        nxt = next((k for k in self.candidates if k > j), None)
        if self._best_k and nxt is not None:
            # later tokens' pi: at most pi_j ("exact"), or pi_j * p_j^t if p stays at p_j ("predict")
            p_next = 1.0 if self.lookahead == "exact" else self._probs[-1]
            later = sum(pis[-1] * p_next ** t for t in range(1, nxt - j + 1))
            bound = (1.0 + sum(pis) + later) / (nxt * self.c_draft + self.c_verify(nxt))
            if bound <= self._best_r:
                self._submit = self._best_k
                return False
        return True

    def submit_count(self, drafted: int) -> int:
        if self._fixed is not None or self._submit is None:
            return drafted
        return min(self._submit, drafted)

    def observe(self, entropies: Sequence[float], accepted: int, submitted: int,
                draft_step_s: float | None, verify_s: float) -> None:
        self.rounds_seen += 1
        self._learn(entropies, accepted, submitted)
        self._learn_costs(submitted, draft_step_s, verify_s)

    def observe_batch(self, entropies, accepted, submitted, draft_step_s, verify_s) -> None:
        """Every sequence's tokens update the entropy centres and counts; the round count and the
        costs (the batch's) update once."""
        self.rounds_seen += 1
        for seq_entropies, a in zip(entropies, accepted):
            self._learn(seq_entropies, a, submitted)
        self._learn_costs(submitted, draft_step_s, verify_s)

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

    def _learn_costs(self, submitted: int, draft_step_s: float | None, verify_s: float) -> None:
        if draft_step_s is not None:
            self.c_draft = draft_step_s if self.c_draft is None else \
                (1 - self.ema_cost) * self.c_draft + self.ema_cost * draft_step_s
        self.c_verify.add(submitted, verify_s)

    def trace(self) -> dict:
        if self._fixed is not None:
            return {}
        k = self._submit if self._submit is not None else len(self._probs)
        return {"accept_probs": self._probs[:k], "survival": survival(self._probs[:k]),
                "cost_draft": self.c_draft, "cost_verify": self.c_verify(k)}


class CycleK(FixedK):
    """Cycle through `ks`, one k per round: the calibration profile's controller (every k is
    measured on the same prompt and cache, repeatedly, before anything is timed)."""

    name = "cycle"

    @dataclass(frozen=True)
    class Options(OptionSet):
        ks: tuple[int, ...] = option((1, 2, 4, 8, 12, 16), "spans the entropy controller's candidates, so "
                                                             "C_v(k)'s line is fitted, not extrapolated",
                                     check=non_empty(at_least(1)))

    def __init__(self, **options):
        Controller.__init__(self, **options)
        self.ks = list(self.opts.ks)
        self.max_k = max(self.ks)
        self.rounds = 0
        self.k = self._limit = self.ks[0]

    def start_round(self, limit: int) -> None:
        self.k = self.ks[self.rounds % len(self.ks)]
        self._limit = min(self.k, limit)

    def observe(self, entropies, accepted, submitted, draft_step_s, verify_s) -> None:
        self.rounds += 1


class HeuristicK(FixedK):
    """transformers' "heuristic" schedule for assisted decoding: k += 2 after a round where every
    draft was accepted, k -= 1 (never below 1) otherwise."""

    name = "heuristic"

    @dataclass(frozen=True)
    class Options(OptionSet):
        k: int = option(20, "transformers' num_assistant_tokens default", check=at_least(1))
        max_k: int = option(64, "a ceiling, so the preallocated cache has room for a round", check=at_least(1))

    def __init__(self, **options):
        super().__init__(**options)
        self.max_k = max(self.opts.max_k, self.k)

    def observe(self, entropies, accepted, submitted, draft_step_s, verify_s) -> None:
        if submitted:
            self.k = min(self.k + 2, self.max_k) if accepted == submitted else max(self.k - 1, 1)


def make_controller(name: str, **options) -> Controller:
    if name not in CONTROLLERS:
        raise ConfigError(f"unknown controller {name!r}; accepted: {sorted(CONTROLLERS)}")
    return CONTROLLERS[name](**options)
