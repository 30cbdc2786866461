"""The cost side of the choice of k: the expected tokens per second R(k), and C_v(k) fitted from
measured verification seconds.

With survival pi_m = prod_{i<=m} p_i, C_d the seconds of one draft step, C_v(k) those of one
verification of k drafts plus the last token and C_s those of the round's KV selection,
    R(k) = (1 + sum_{m<=k} pi_m) / (k * C_d + C_v(k) + C_s),     k* = argmax_{k in K} R(k)
(the 1 counts the token verification always adds; ties go to the smaller k). The denominator is a
round's whole seconds, as the fallback rule measures them; C_s = 0 gives the paper's form.
Once j >= k tokens are drafted, their j draft steps are paid whichever k is submitted:
    R_paid(k; j) = (1 + sum_{m<=k} pi_m) / (j * C_d + C_v(k) + C_s).

C_v(k) from the measured seconds per k (each an EMA over the rounds that verified k drafts). A
point not measured again for more than `max_age` rounds (of any kind) leaves the fit, or returns to its
cost profile's value where one was seeded: it describes another state of the machine (another
thread count, a load since gone, a generation's cold first round), and the k it stands for is not
being chosen, so nothing would refresh it. Kept, one such point can freeze k: a first k = 2 round
measured cold at one thread put a slope of 39 ms a token under later k = 1 rounds at two threads,
so every larger k looked too dear to try. With no point fresh, the last measured k alone is the fit
(a flat line): the rule drafts further, and the k it submits is measured. For the same reason a
k's first measurement is replaced by its second, not averaged with it (the first round at a k runs
cold, and the thread rule tries a new draft limit at one thread first), and a stale point starts
over: its next measurement stands alone, and is replaced by the one after.
A seeded (profile) point never leaves the fit. The profile is measured at the thread count the
harness's probe chose, which is the online thread rule's starting count; where the rule moves to
another count, the profile's k that are never chosen keep their values (a known limit).

- `LinearCostModel`: a least-squares line, C_v(k) = a + b k (the paper's cost model); its slope is
  never negative and its intercept never below 0 (then refitted through the origin), so no k is
  predicted free. One measured k gives a flat line.
- `HullCostModel`: the lower convex hull of the measured points, flat left of its first point and
  never below it: exact at the smallest k and wherever the measured costs bend upwards. Batched
  attention over many rows can grow faster than linearly in k, and a line through such costs
  predicts the small k too cheap. A convex C_v keeps R(k) unimodal (a concave numerator over a
  convex denominator), so the entropy controller's online rule stays exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence


def survival(probs: Sequence[float]) -> list[float]:
    """pi_m = prod_{i<=m} p_i."""
    out, acc = [], 1.0
    for p in probs:
        acc *= p
        out.append(acc)
    return out


def expected_ratio(pis: Sequence[float], k: int, c_draft: float, c_verify: Callable[[int], float],
                   c_select: float = 0.0, steps: int | None = None) -> float:
    """R(k) = (1 + sum_{m<=k} pi_m) / (k C_d + C_v(k) + C_s); with `steps` = j draft steps already
    paid, R_paid(k; j) (j C_d in place of k C_d)."""
    return (1.0 + sum(pis[:k])) / ((k if steps is None else steps) * c_draft + c_verify(k) + c_select)


def choose_k(probs: Sequence[float], candidates: Sequence[int], c_draft: float,
             c_verify: Callable[[int], float], c_select: float = 0.0) -> int:
    """Closed form: argmax over candidates (<= len(probs)) of R(k); ties to the smaller k."""
    pis = survival(probs)
    best_k, best_r = None, -math.inf
    for k in sorted(candidates):
        if k > len(pis):
            break
        r = expected_ratio(pis, k, c_draft, c_verify, c_select)
        if r > best_r:
            best_k, best_r = k, r
    return best_k


@dataclass
class LinearCostModel:
    """C_v(k) = a + b k, from an EMA of measured seconds per k (stale points aside: module docstring)."""
    ema: float = 0.2
    max_age: int | None = 16                            # rounds past its measurement a point still counts
    by_k: dict = field(default_factory=dict)            # k -> EMA of measured seconds (from the prior, if seeded)
    prior: dict = field(default_factory=dict)           # k -> a cost profile's seconds: they do not age
    measured_at: dict = field(default_factory=dict)     # k -> the round it was last measured in
    rounds: int = 0                                     # rounds seen (`tick`), AR rounds included
    last: int | None = None                             # the k measured last
    times: dict = field(default_factory=dict)           # k -> measurements so far

    def seed(self, k: int, seconds: float) -> None:
        """A cost profile's C_v(k): the EMA's start, and the fit's point for k whenever its
        measurements are stale."""
        self.prior[k] = self.by_k[k] = seconds

    def tick(self) -> None:
        """One round ran (with or without drafts): every point is a round older."""
        self.rounds += 1

    def add(self, k: int, seconds: float) -> None:
        """One measured verification of k drafts. It restarts k's EMA (from the profile's value where
        one was seeded) when k was measured once only, counting from its last start: a generation's
        first round at a k runs cold (new shapes; on trial at another thread count), and is not
        averaged in. A stale point starts over: this measurement stands alone."""
        if self.stale(k):
            self.times[k] = 0
        restart = self.times.get(k) in (0, 1) and k in self.measured_at
        start = self.prior.get(k) if restart else self.by_k.get(k, self.prior.get(k))
        self.by_k[k] = seconds if start is None else (1 - self.ema) * start + self.ema * seconds
        self.times[k] = self.times.get(k, 0) + 1
        self.measured_at[k], self.last = self.rounds, k

    def stale(self, k: int) -> bool:
        """k was measured, but more than `max_age` rounds ago."""
        at = self.measured_at.get(k)
        return at is not None and self.max_age is not None and self.rounds - at > self.max_age

    def points(self) -> dict:
        """The (k, seconds) points the fit uses (module docstring)."""
        fresh = {}
        for k, v in self.by_k.items():
            if not self.stale(k):
                fresh[k] = v                            # a seeded point never measured, or a fresh one
            elif k in self.prior:
                fresh[k] = self.prior[k]
        if not fresh and self.last is not None:
            fresh[self.last] = self.by_k[self.last]
        return fresh

    def line(self) -> tuple[float, float] | None:
        points = self.points()
        if not points:
            return None
        ks, vs = list(points), list(points.values())
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
        for k, v in sorted(self.points().items()):
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
