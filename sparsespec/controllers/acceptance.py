"""How likely a draft token is accepted, from its entropy: the paper's two-centre form and the
binned evidence of judged drafts.

    paper:  p = exp(-|H - mu_acc|/tau) / (exp(-|H - mu_acc|/tau) + exp(-|H - mu_rej|/tau))
    binned: p = (a_b + s * rate) / (n_b + s)   for H's bin b (a_b of n_b judged drafts accepted),
            shrunk towards the overall rate with s pseudo-drafts

A round's judged drafts are its accepted ones and its first rejected one; drafts after that were
never judged, so they count for nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence


def paper_acceptance(entropy: float, mu_acc: float, mu_rej: float, tau: float = 1.0) -> float:
    """p = softmax over the negative L1 distances of H to the accepted and rejected centres."""
    a = math.exp(-abs(entropy - mu_acc) / tau)
    r = math.exp(-abs(entropy - mu_rej) / tau)
    return a / (a + r)


def with_base_rate(p: float, rate: float) -> float:
    """Bayes' rule with a prior: p is the posterior under equal class priors (the paper's form);
    reweight it by the prior odds rate / (1 - rate) of a judged draft token being accepted."""
    return rate * p / (rate * p + (1.0 - rate) * (1.0 - p))


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
