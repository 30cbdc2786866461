"""Plain decoding as a candidate: when speculation is predicted slower than AR, a round is one AR
step (k = 0: no draft, a verification of the last token alone, one token per sequence).

Rates, from recent measured rounds (W = `window`), each round's seconds its whole wall time
(KV selection, every draft step run, discarded ones too, and the verification), for AR rounds and
speculative rounds alike:
    A = 1 / median(seconds of the last W AR rounds)                            AR tokens/s per sequence
    S = mean(tokens of the last W speculative rounds) / median(their seconds)    speculation's tokens/s
where a speculative round's tokens are mean_b (a_b + 1). Medians for seconds: one round slowed by a
burst of background load moves nothing, and a lasting change moves the median within ceil(W/2)
rounds. The mean for tokens: acceptance has no spikes, and the median of a skewed count is biased.
A prior C_AR (a cost profile's k = 0 rounds, `seed_ar`) is the AR window's first entry, so a prompt
with one opens speculating; the AR rounds it runs replace it.

Speculation loses when S < margin * A, judged only on a full window of W speculative rounds: a
short stretch of rejected drafts at the start of a prompt, or a median a few percent off, does not
switch to AR.

The choice, each round:
    no AR round measured and no prior              -> "ar_probe" (k = 0, to measure A)
    speculating                                    -> "speculate"; after the round, if speculation
                                                      loses, switch to fallback
    in fallback, fewer than `wait` AR rounds since
    the last probe                                 -> "fallback" (k = 0)
    otherwise                                      -> "probe": one speculative round (the caller
                                                      bounds its k); after it
        S >= margin * A on the speculative rounds measured so far, the window full or not (a
        warm-up lost in one round is not outvoted by a window too short to judge)
                                           -> speculate again; wait <- probe_every
        the probe's own (a + 1) / s >= A   -> probe again next round (good probes refill the
                                           window, so S catches up within ceil(W/2) rounds; a probe
                                           that merely came within the margin of AR paid nothing
                                           back, and probing on at break-even loses a little each
                                           round where speculation cannot pay, e.g. a short prompt)
        else                               -> wait <- min(2 wait, probe_max); count AR rounds afresh
So while speculation keeps losing, probes come ever more rarely (every probe_every, 2 probe_every,
..., probe_max AR rounds), and each costs at most one bounded speculative round.
"""
from __future__ import annotations

import math
import statistics
from collections import deque

SPECULATE, PROBE, FALLBACK, AR_PROBE = "speculate", "probe", "fallback", "ar_probe"
PLAIN = (FALLBACK, AR_PROBE)       # the choices that run a round with no draft


class PlainFallback:
    """The choice between speculation and plain decoding (module docstring)."""

    def __init__(self, window: int, probe_every: int, probe_max: int, margin: float = 1.0):
        self.probe_every, self.probe_max, self.margin = probe_every, probe_max, margin
        self.ar_seconds: deque[float] = deque(maxlen=window)
        self.spec_tokens: deque[float] = deque(maxlen=window)
        self.spec_seconds: deque[float] = deque(maxlen=window)
        self.needed = window                       # speculative rounds measured before S is judged
        self.falling_back = False
        self.wait = probe_every                    # AR rounds between probes
        self.idle = 0                              # AR rounds since entering fallback or the last probe
        self.probe_again = False

    def cost_ar(self) -> float | None:
        """C_AR: the median seconds of the recent AR rounds."""
        return statistics.median(self.ar_seconds) if self.ar_seconds else None

    def seed_ar(self, seconds: float) -> None:
        """A prior C_AR (seconds of one AR step, measured before this prompt): A is known from the
        first round, so no `ar_probe` is run; measured AR rounds push it out of the window."""
        self.ar_seconds.append(seconds)

    def ar_rate(self) -> float:
        return 1.0 / self.cost_ar()

    def threshold(self) -> float:
        """The rate speculation must reach to go on: margin * A."""
        return self.margin * self.ar_rate()

    def speculation_rate(self) -> float:
        """S: mean tokens over median seconds of the recent speculative rounds."""
        return statistics.fmean(self.spec_tokens) / statistics.median(self.spec_seconds)

    def speculation_loses(self) -> bool:
        return len(self.spec_seconds) >= self.needed and self.speculation_rate() < self.threshold()

    def speculation_wins(self) -> bool:
        """S >= margin * A on the speculative rounds measured so far, the window full or not: what a
        return from plain decoding needs (a window not yet full is no evidence that speculation pays)."""
        return bool(self.spec_seconds) and self.speculation_rate() >= self.threshold()

    def choose(self) -> str:
        """This round's choice (module docstring)."""
        if not self.ar_seconds:
            return AR_PROBE
        if not self.falling_back:
            return SPECULATE
        if self.probe_again or self.idle >= self.wait:
            return PROBE
        return FALLBACK

    def observe(self, choice: str, submitted: int, tokens: float, seconds: float) -> None:
        """A measured round: `tokens` per sequence in `seconds` (the whole round's); `choice` is what `choose` said ("" for
        a round it did not choose, e.g. a warm-up or the last, token-limited round: measured alone)."""
        if submitted == 0:
            self.ar_seconds.append(seconds)
        else:
            self.spec_tokens.append(tokens)
            self.spec_seconds.append(seconds)
        if choice == FALLBACK:
            self.idle += 1
        elif choice == SPECULATE and self.speculation_loses():
            self.falling_back, self.idle, self.probe_again = True, 0, False
        elif choice == PROBE:
            self.after_probe(tokens / seconds if seconds > 0 else math.inf)

    def fall_back(self) -> None:
        """Plain decoding from now on, speculation re-probed as after any switch (the warm-up lost)."""
        self.falling_back, self.idle, self.probe_again = True, 0, False

    def after_probe(self, probe_rate: float) -> None:
        if self.speculation_wins():
            self.falling_back, self.wait, self.probe_again = False, self.probe_every, False
        elif probe_rate >= self.ar_rate():         # beat AR, not merely within the margin (docstring)
            self.probe_again = True
        else:
            self.probe_again, self.idle = False, 0
            self.wait = min(2 * self.wait, self.probe_max)
