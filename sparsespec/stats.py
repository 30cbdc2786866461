"""Every statistic sparsespec reports, defined once.

`Generation` (one prompt), the harness's summaries (`sparsespec/harness/results.py`), the lm-eval
statistics (`sparsespec/lm_eval/stats.py`), `analysis/` and `experiments/cost_model.py` all call
these functions; none computes a rate, a speed-up or a cost of its own.

A round (`sparsespec.engine.generation.Round`, or its dict in samples.jsonl) drafts `drafted` tokens in
`draft_steps` draft forwards, verifies them in one forward, accepts `accepted` and emits `emitted`
tokens (accepted + 1, the target's own token, fewer only when the output is cut). So:

- acceptance rate  = sum(accepted) / sum(drafted), pooled over rounds (0.0 when nothing was drafted);
- mean accepted    = sum(emitted) / rounds: tokens per round, the bonus token included (AR = 1.00);
- decode tokens/s  = sum(emitted) / decode seconds (prefill excluded);
- speed-up         = a prompt's decode tokens/s over AR's on the same prompt in the same process;
  a run reports the geometric mean over prompts with its Student-t 95% interval on the log scale
  (`geometric_ci`: exp(mean(log r) +- t s/sqrt(n)), never below 0; a ratio of 2 and one of 1/2
  average to 1). Every ratio averages this way; plain quantities (tokens/s, tokens per round,
  seconds) keep arithmetic means (`mean_ci`);
- C_AR             = AR decode seconds per AR token;
- C_d              = draft seconds per draft step;
- C_v(k)           = mean verify seconds of the rounds that verified k drafts;
- cost-model bound = tau * C_AR / (s * C_d + C_v): the speed-up the measured costs and acceptance
  allow if nothing but drafting and verification took time (tau = mean accepted, s = draft steps
  per round, C_v = verify seconds per round), per prompt like the speed-up, and averaged over
  prompts like it; `bound_reached` = mean speed-up / mean bound.
- batched bound    = the same for a batch decoded together (weights read once per step for the
  whole batch, each sequence's KV read for it): the batch's tokens over the seconds its rounds
  spent drafting and verifying, over batched AR's tokens/s at the same batch size; per batch
  (geometric mean over batches, like the batch speed-up).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

CI_LEVEL = 0.95


# --------------------------------------------------------------------------------------------
# counting rounds


def _field(round_: Any, name: str, default=0):
    """A Round's field, from the dataclass or from its samples.jsonl dict."""
    if isinstance(round_, Mapping):
        value = round_.get(name, default)
    else:
        value = getattr(round_, name, default)
    return default if value is None else value


@dataclass(frozen=True)
class RoundTotals:
    """Sums over a list of rounds (of one prompt, or pooled over prompts)."""
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    draft_steps: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    select_s: float = 0.0


def round_totals(rounds: Iterable) -> RoundTotals:
    rounds = list(rounds)
    return RoundTotals(rounds=len(rounds),
                       **{name: sum(_field(r, name) for r in rounds)
                          for name in ("drafted", "accepted", "emitted", "draft_steps", "draft_s", "verify_s",
                                       "select_s")})


# --------------------------------------------------------------------------------------------
# rates


def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None when either is missing or den is 0."""
    if num is None or not den:
        return None
    return num / den


def acceptance_rate(accepted: int, drafted: int) -> float:
    """Drafted tokens accepted over tokens drafted (pooled counts); 0.0 when nothing was drafted."""
    return accepted / drafted if drafted else 0.0


def mean_accepted(emitted: int, rounds: int) -> float:
    """Tokens emitted per round, the target's own token included: 1.0 for AR; 0.0 with no round."""
    return emitted / rounds if rounds else 0.0


def tokens_per_s(tokens: float, seconds: float) -> float:
    """Decode throughput; 0.0 when no time was measured."""
    return tokens / seconds if seconds > 0 else 0.0


def speedup(method_tokens_per_s: float | None, ar_tokens_per_s: float | None) -> float | None:
    """One prompt's speed-up: the method's decode tokens/s over AR's (same prompt, same process);
    None when either rate is missing or 0 (`tokens_per_s` gives 0 when no decode time was measured,
    and a speed-up of 0 or infinity has no log to average)."""
    if not method_tokens_per_s or not ar_tokens_per_s:
        return None
    return method_tokens_per_s / ar_tokens_per_s


# --------------------------------------------------------------------------------------------
# across prompts

# a judgement of an interval against no effect (a ratio of 1): `Estimate.verdict`
REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"
NOT_MEASURABLE = "not measurable here"       # no estimate at all: nothing was measured to compare


@dataclass(frozen=True)
class Estimate:
    """A mean, or a ratio's geometric mean, with its 95% interval: the one interval type of the
    harness's summaries (`mean_ci`, `geometric_ci`) and of `analysis/` (per cell, and pooled over cells
    with how many cells it rests on, its p-value and how it was computed)."""
    mean: float | None         # the estimate; for a ratio, exp of its log-scale estimate (also `ratio`)
    low: float | None          # its confidence interval (Student-t for `mean_ci`); None without one
    high: float | None
    n: int = 0                 # values (prompts) it rests on
    cells: int = 1             # blocks (cells) those values came in
    p: float | None = None     # p-value against no effect (a ratio of 1); None where not computed
    how: str = ""
    std: float | None = None   # sample standard deviation (n - 1), of the logs for a ratio; None below two values

    @property
    def ratio(self) -> float | None:
        """The estimate, named for a ratio (`mean`)."""
        return self.mean

    def text(self, unit: str = "×") -> str:
        """`1.52× [1.20, 1.93]`; `–` without an estimate; `1.52× (n=1)` without an interval."""
        if self.mean is None:
            return "–"
        if self.low is None:
            return f"{self.mean:.2f}{unit} (n={self.n})"
        return f"{self.mean:.2f}{unit} [{self.low:.2f}, {self.high:.2f}]"

    def sample(self) -> str:
        """`n = 54 prompts in 18 cells`."""
        return f"n = {self.n} prompt{'s' * (self.n != 1)} in {self.cells} cell{'s' * (self.cells != 1)}"

    def verdict(self) -> str:
        """For a ratio: reproduced (interval above 1), contradicted (interval below 1), inconclusive (it
        holds 1, or there is no interval), not measurable here (no estimate)."""
        if self.mean is None:
            return NOT_MEASURABLE
        if self.low is None:
            return INCONCLUSIVE
        return REPRODUCED if self.low > 1 else CONTRADICTED if self.high < 1 else INCONCLUSIVE

    def columns(self) -> tuple[float, float, float]:
        """(estimate, low, high) for a table's columns, NaN where missing."""
        return tuple(math.nan if x is None else x for x in (self.mean, self.low, self.high))


def mean_ci(values: Iterable[float], level: float = CI_LEVEL) -> Estimate:
    """Mean over prompts with its Student-t confidence interval: mean +- t_{(1+level)/2, n-1} * s / sqrt(n)."""
    values = [float(v) for v in values if v is not None and not math.isnan(v)]
    n = len(values)
    if n == 0:
        return Estimate(None, None, None, 0)
    mean = statistics.fmean(values)
    if n < 2:
        return Estimate(mean, None, None, n)
    # imported here: the harness imports this module on GPU images that may lack scipy, and needs it
    # only for an interval over two or more prompts
    from scipy.stats import t
    std = statistics.stdev(values)
    half = float(t.ppf((1 + level) / 2, n - 1)) * std / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n, std=std)


def log_ratios(values: Iterable[float | None]) -> list[float]:
    """log r of each ratio, None and NaN left out; a ValueError naming the first ratio <= 0 (it has no log)."""
    values = [float(v) for v in values if v is not None and not math.isnan(v)]
    bad = next((v for v in values if v <= 0), None)
    if bad is not None:
        raise ValueError(f"a ratio must be positive to take its log; got {bad}")
    return [math.log(v) for v in values]


def geometric_ci(ratios: Iterable[float | None], level: float = CI_LEVEL) -> Estimate:
    """Geometric mean of positive ratios with its Student-t interval on the log scale:
    exp(m +- t_{(1+level)/2, n-1} * s / sqrt(n)), m and s the mean and sample SD of log r.
    `mean` is exp(m), `std` is s (the SD of the logs, not of the ratios), `low`/`high` the
    interval's bounds (both > 0); one ratio gives itself and no interval, none gives None."""
    logs = mean_ci(log_ratios(ratios), level)
    exp = lambda x: None if x is None else math.exp(x)      # noqa: E731
    return Estimate(exp(logs.mean), exp(logs.low), exp(logs.high), logs.n, std=logs.std)


# --------------------------------------------------------------------------------------------
# costs and the cost-model bound


def c_ar(ar_decode_s: float, ar_decode_tokens: float) -> float | None:
    """C_AR: seconds per token of plain decoding."""
    return ratio(ar_decode_s, ar_decode_tokens)


def c_draft(totals: RoundTotals) -> float | None:
    """C_d: seconds per draft forward; None when nothing ran a draft step (AR, or no model drafts)."""
    return ratio(totals.draft_s, totals.draft_steps)


def c_verify_by_k(rounds: Iterable) -> dict[int, float]:
    """C_v(k): mean verify seconds of the rounds that verified k drafts, by k."""
    by_k: dict[int, list[float]] = {}
    for r in rounds:
        by_k.setdefault(int(_field(r, "drafted")), []).append(float(_field(r, "verify_s")))
    return {k: statistics.fmean(v) for k, v in sorted(by_k.items())}


def cost_bound(tau: float, steps: float, c_ar_s: float, c_d: float, c_v: float, select_s: float = 0.0) -> float:
    """The cost-model speed-up bound tau * C_AR / (steps * C_d + C_v [+ select]): tokens per round
    at AR's cost per token, over the seconds a round's drafting and verification take."""
    return tau * c_ar_s / (steps * c_d + c_v + select_s)


def cost_metrics(rounds: Iterable) -> dict:
    """The measured costs of a method's rounds, pooled (over prompts, when given several)."""
    rounds = list(rounds)
    totals = round_totals(rounds)
    return {"c_draft_s": c_draft(totals), "c_verify_s": ratio(totals.verify_s, totals.rounds),
            "c_verify_s_by_k": {str(k): c for k, c in c_verify_by_k(rounds).items()},   # JSON keys
            "select_s_per_round": ratio(totals.select_s, totals.rounds),
            "draft_steps_per_round": ratio(totals.draft_steps, totals.rounds)}


def prompt_bound(rounds: Iterable, c_ar_s: float | None) -> float | None:
    """The cost-model bound of one prompt's decode: its tau, draft steps per round, C_d and C_v,
    against the C_AR of AR on the same prompt; None when no draft step ran or there is no C_AR (or it
    is 0: no AR decode time was measured, so a bound of 0 would say nothing)."""
    rounds = list(rounds)
    totals = round_totals(rounds)
    c_d = c_draft(totals)
    if c_d is None or not c_ar_s or not totals.rounds:
        return None
    return cost_bound(mean_accepted(totals.emitted, totals.rounds), totals.draft_steps / totals.rounds,
                      c_ar_s, c_d, totals.verify_s / totals.rounds)


def batch_bound(rounds_per_sequence: Iterable[Iterable], ar_batch_tokens_per_s: float | None) -> float | None:
    """The cost-model bound of one batch: sum(emitted) over every sequence, over the draft and verify
    seconds of the batch's rounds, as a ratio to batched AR's tokens/s. A batch's round times are
    shared by the sequences in it and every sequence starts in round 1, so the sequence with the
    most rounds lists every round of the batch once. None without rounds, tokens or an AR rate."""
    sequences = [list(r) for r in rounds_per_sequence]
    longest = max(sequences, key=len, default=[])
    seconds = sum(float(_field(r, "draft_s")) + float(_field(r, "verify_s")) for r in longest)
    emitted = sum(int(_field(r, "emitted")) for rounds in sequences for r in rounds)
    if not ar_batch_tokens_per_s or not seconds or not emitted:
        return None
    return emitted / seconds / ar_batch_tokens_per_s
