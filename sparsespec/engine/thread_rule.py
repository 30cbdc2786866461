"""How many intra-op threads the decode loop runs with, chosen online from the rounds it runs.

Speculation is many small multi-row matmuls. With several OpenMP threads each one waits for every
thread, so a core busy with another process stalls a round for a scheduler slice, while one thread
waits for nobody; on a quiet machine the threads may pay. Which holds is not known in advance and
changes while a generation runs, so the loop measures its own rounds at each of `thread_counts()`
(1 and the process's default) and keeps the faster, as the plain fallback keeps AR or speculation.

Rounds are compared only with rounds of the same key, the round's draft limit L (0: an AR step), so
that a count is never judged on cheaper rounds than the other:

    explore  each round runs at the count with fewer rounds of its key in this exploration (a tie:
             the fewer threads, whose worst case is mild: on a loaded core one multi-row round at
             two threads took 4.8 s against ~0.3 s at one), until one key has `rounds` rounds at
             every count; a re-exploration explores only the key of the last choice (rounds of
             other keys, e.g. a speculation probe, run at the current count and are not counted,
             so a generation speculating on other keys holds its count until that key returns).
             A round with drafts (key > 0) tries a count above the fewest only once AR steps (key 0)
             at that count, in this exploration, were no slower than at the fewest (within the
             margin): beside a loaded core a 2-thread AR step costs ~2.5 AR steps, a 2-thread
             warm-up round of k = 2 took 5.1 s against 0.38 s at one thread. The AR steps judged
             are the last 2 `rounds` + 1 at each count, from this exploration or an earlier one. Where
             AR steps never ran at the count, rounds with drafts stay at the fewest threads (so a
             method that never runs an AR step, e.g. fixed k, and has no prior drafts at one
             thread). When no key reaches `rounds` rounds at every count within 8 `rounds` rounds
             (a speculating generation's limit changes every round), the rule holds the current
             count only where it has evidence (a prior, an earlier choice, or AR steps no slower at
             it), else the fewest; otherwise
                 ratio = median(seconds | other count, key) / median(seconds | current count, key)
             and the rule switches when ratio < margin (the other count faster by more than
             1 - margin; a near-tie stays, so noise does not flip the count back and forth)
    hold     every round at the chosen count. It explores again after `wait` rounds, or sooner when
             the choice is in doubt, judged on the chosen count's recent rounds of the key it was
             chosen on:
                 load came   the last `rounds` of them cost more than the other count did at the
                             choice, by more than the margin (their median: the other may now win);
                 load left   the last 2 `rounds` + 1 of them cost `drift` less than the first
                             2 `rounds` + 1 after the choice (means: the other may win again).
             Not a median merely moving: on a loaded core one thread's rounds alternate between
             ~0.07 and ~0.15 s, a median of 3 (or of 3 at the choice) moves 30% every few rounds,
             and each needless exploration runs 3 rounds at a count 3x slower. (A change inside
             the first window after a choice sets the baseline itself: the wait finds it.)
             An exploration that keeps the count doubles `wait` (up to `wait_max`); one that
             switches resets it to `wait_first`.

A prior count (the harness's thread probe, `thread_prior`) opens in `hold` at that count, so the
probe is this rule's starting point rather than a second mechanism. A fixed count (`threads=N`) and
a machine with one count run no rule (`FixedThreads`).

Switching costs one `torch.set_num_threads` and the first parallel op after it; `switch_cost_s`
(sparsespec/threads.py) measures it once per process, and `report()` records the switches and their
measured cost with the generation.
"""
from __future__ import annotations

import statistics
from collections import defaultdict, deque

import torch

from sparsespec import threads
from sparsespec.errors import ConfigError

AUTO = "auto"


class FixedThreads:
    """One count for the whole generation (None: leave the process's count as it is)."""

    def __init__(self, count: int | None):
        self.count = count

    def before_round(self, key: int) -> int:
        if self.count is not None and torch.get_num_threads() != self.count:
            torch.set_num_threads(self.count)
        return torch.get_num_threads()

    def observe(self, key: int, seconds: float) -> None:
        pass

    def report(self) -> dict:
        return {"threads": self.count if self.count is not None else torch.get_num_threads()}


class OnlineThreads:
    """The online thread rule (module docstring)."""

    def __init__(self, counts: tuple[int, ...], prior: int | None = None, rounds: int = 3,
                 wait_first: int = 16, wait_max: int = 256, margin: float = 0.97, drift: float = 0.3):
        self.counts = tuple(counts)
        self.rounds, self.margin, self.drift = rounds, margin, drift    # 3: the least a median ignores one spike with
        self.window = 2 * rounds + 1                                   # rounds a "load left" mean spans
        self.wait_first, self.wait_max = wait_first, wait_max          # 16 rounds: a re-probe costs < 10% of a hold
        self.prior = prior
        self.current = prior if prior in self.counts else max(self.counts)
        self.exploring = prior not in self.counts                      # no prior: measure from the first round
        self.wait, self.held = wait_first, 0
        self.seen: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))  # count -> key -> s
        self.ar_steps: dict[int, deque] = {t: deque(maxlen=self.window) for t in self.counts}  # recent AR steps by count
        self.chosen_on: tuple[int, float, float] | None = None         # (key, median s, the other's) at the choice
        self.recent: list[float] = []                                  # the current count's rounds of that key
        self.settled: float | None = None                              # their mean over the first window held
        self.running = self.current
        self.switches = 0
        self.reprobes = 0

    # --- per round ------------------------------------------------------------------------------

    def before_round(self, key: int) -> int:
        """Set the count this round runs at; returns it."""
        self.running = self.pick(key) if self.exploring else self.current
        if torch.get_num_threads() != self.running:
            torch.set_num_threads(self.running)
            self.switches += 1
        return self.running

    def pick(self, key: int) -> int:
        """Exploring: the count with the fewest rounds of `key` so far (a tie: the fewer threads); a
        re-exploration runs rounds of keys other than the last choice's at the current count."""
        if not self.on_chosen_key(key):
            return self.current
        counts = self.counts if key == 0 else self.tried_on_ar_steps()
        return min(counts, key=lambda t: (len(self.seen[t][key]), t))

    def tried_on_ar_steps(self) -> list[int]:
        """The counts a round with drafts may explore (module docstring): the fewest, and each other
        count whose recent AR steps (the last 2 `rounds` + 1 at each count, whenever run) were no
        slower than the fewest's, within the margin."""
        fewest = min(self.counts)
        base = self.ar_steps[fewest]
        return [fewest] + [t for t in self.counts if t != fewest and base and self.ar_steps[t]
                           and statistics.median(self.ar_steps[t]) * self.margin <= statistics.median(base)]

    def on_chosen_key(self, key: int) -> bool:
        """`key` is the one the last choice was made on, or no choice was made yet."""
        return self.chosen_on is None or key == self.chosen_on[0]

    def observe(self, key: int, seconds: float) -> None:
        """The round of `key` just run at `self.running` took `seconds`."""
        if key == 0:
            self.ar_steps[self.running].append(seconds)
        if self.exploring:
            if not self.on_chosen_key(key):
                return                         # a re-exploration measures the last choice's key only
            self.seen[self.running][key].append(seconds)
            if all(len(self.seen[t][key]) >= self.rounds for t in self.counts):
                self.decide(key)
            elif sum(len(s) for by_key in self.seen.values() for s in by_key.values()) >= 8 * self.rounds:
                self.settle_unmeasured()                                    # keys kept changing
            return
        self.held += 1
        if self.chosen_on is not None and self.on_chosen_key(key):
            self.recent = (self.recent + [seconds])[-self.window:]
            if self.settled is None and len(self.recent) == self.window:
                self.settled = statistics.fmean(self.recent)
        if self.held >= self.wait or self.moved():
            self.explore()

    # --- the decisions --------------------------------------------------------------------------

    def decide(self, key: int) -> None:
        """End of an exploration: the faster count on rounds of `key`."""
        medians = {t: statistics.median(self.seen[t][key]) for t in self.counts}
        best = min(self.counts, key=lambda t: medians[t])
        switched = best != self.current and medians[best] < self.margin * medians[self.current]
        if switched:
            self.current = best
        self.chosen_on = (key, medians[self.current], min(m for t, m in medians.items() if t != self.current))
        self.hold(switched)

    def settle_unmeasured(self) -> None:
        """No key was measured at every count (a speculating generation changes its limit each round):
        hold the current count where it has evidence (a prior, an earlier choice on measured rounds, or
        AR steps at it no slower than at the fewest), else the fewest, whose worst case beside a busy
        core is mild (module docstring)."""
        trusted = (self.current == self.prior or self.chosen_on is not None
                   or self.current in self.tried_on_ar_steps())
        switched = not trusted and self.current != min(self.counts)
        if switched:
            self.current = min(self.counts)
        self.hold(switched)

    def hold(self, switched: bool) -> None:
        self.exploring, self.held, self.recent, self.settled = False, 0, [], None
        self.wait = self.wait_first if switched else min(2 * self.wait, self.wait_max)

    def moved(self) -> bool:
        """The choice is in doubt (module docstring): load came or load left."""
        if self.chosen_on is None or len(self.recent) < self.rounds:
            return False
        other = self.chosen_on[2]
        came = statistics.median(self.recent[-self.rounds:]) * self.margin > other
        left = self.settled is not None and statistics.fmean(self.recent) < (1 - self.drift) * self.settled
        return came or left

    def explore(self) -> None:
        self.exploring, self.reprobes = True, self.reprobes + 1
        self.seen.clear()

    def report(self) -> dict:
        """What the rule did, for `Generation.options`."""
        return {"threads": AUTO, "threads_final": self.current, "thread_switches": self.switches,
                "thread_reprobes": self.reprobes, "thread_switch_s": threads.switch_cost_s(self.counts)}


def thread_rule(spec, prior: int | None = None):
    """The rule for `generate(threads=spec, thread_prior=prior)`: "auto" -> `OnlineThreads` over 1 and
    the caller's count now (a `FixedThreads` where that is 1: a caller who set one thread keeps it);
    a positive int -> that count."""
    if spec == AUTO:
        check_count(prior, "thread_prior", allow_none=True)
        counts = threads.thread_counts(torch.get_num_threads())
        return OnlineThreads(counts, prior) if len(counts) > 1 else FixedThreads(None)
    check_count(spec, "threads", allow_none=False)
    return FixedThreads(spec)


def check_count(value, name: str, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        accepted = f"'{AUTO}' or a positive int" if name == "threads" else "a positive int or None"
        raise ConfigError(f"{name}={value!r}; accepted: {accepted}")
