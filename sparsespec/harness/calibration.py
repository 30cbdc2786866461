"""What a run measures before it decodes, from the shared prefill of the first batch it decodes:
AR's attention path and thread count, each drafting method's thread count, and the cost prior of
each entry whose controller reads costs (the profile itself: sparsespec/calibration.py; the thread
rules: thread_choice.py).

The profile is sized to the run (`profile_size`): it decodes at most PROFILE_SHARE of the tokens one
method decodes in the run (num_prompts x max_new_tokens):

    ks      = the floor's and the default ks below max_new_tokens (a round of k drafts emits k + 1 tokens)
    repeats = 2 if two cycles fit, else 1; if one cycle does not fit either, the largest k go first
    floor   = one cycle of k = 1, 2 (C_v's line needs two points)

A run also chooses each method's thread count (thread_choice.py; `plan_profiles`, `measure_planned`):
first a probe, one cycle of the floor, at every count compared, with a few AR steps at each beside it;
then the sized profile at the count the probes chose only (the probe itself when the profile is the
floor). A count that loses under load is never paid for at the profile's full length. Entries of one
method with the same drafter options (`probe_groups`: `sparsespec` and `sparsespec_fixed:k=4` draft and
verify alike, only their controllers differ) share one probe, one count and one sized profile: probed
apart, two measurements of the same work could choose different counts in one process.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from sparsespec import threads
from sparsespec.api import generate
from sparsespec.calibration import (DEFAULT_KS, MIN_AR_STEPS, cycle_tokens, measure_cost_profile, profile_cycle,
                                    profile_decoder)
from sparsespec.controllers import CONTROLLERS
from sparsespec.controllers.cost_profile import CostProfile, full_batch_rounds
from sparsespec.engine.attention import AR_ATTENTION, DEFAULT_AR_ATTENTION
from sparsespec.method_options import resolve
from sparsespec.methods import METHODS

from . import thread_choice

PROFILE_SHARE = 0.25   # of the run's tokens per method: today's 2-cycle profile still fits a 4 x 128-token run
FLOOR_KS = (1, 2)      # the fewest ks that fit C_v's line
AR = "ar"


def profile_size(max_new_tokens: int, num_prompts: int, ks=DEFAULT_KS) -> tuple[tuple[int, ...], int]:
    """(ks, repeats) of a run's profile, by the rule of the module docstring."""
    budget = PROFILE_SHARE * max_new_tokens * num_prompts
    usable = tuple(sorted(set(FLOOR_KS) | {k for k in ks if k < max_new_tokens}))
    for repeats in (2, 1):
        if cycle_tokens(profile_cycle(usable), repeats) <= budget:
            return usable, repeats
    while len(usable) > len(FLOOR_KS) and cycle_tokens(profile_cycle(usable), 1) > budget:
        usable = usable[:-1]
    return usable, 1


class ProfileJob(NamedTuple):
    """One generation of a run's calibration: a probe or cost profile of one drafter, shared by the
    run's `entries` that decode with it (`probe_groups`), or AR steps."""
    method: str
    options: dict
    length: int        # max_new_tokens of its generation
    entries: tuple[str, ...]   # the run's entries it calibrates ((AR,) for the AR steps)
    threads: int | None   # None: the sized profile, at the count the entries' probes choose
    priors: tuple[str, ...] = ()   # those of `entries` whose controller reads costs: each gets the profile as its prior
    ar_attention: str | None = None   # AR steps: the way they attend (attention.AR_ATTENTION)

    @property
    def costs(self) -> bool:
        """Whether it is a cost profile (an entry reads costs), else the first entry decoding as itself."""
        return bool(self.priors)


def probe_groups(wanted: dict[str, tuple[str, dict]]) -> list[tuple[str, ...]]:
    """The entries of `wanted` (entry -> (method, options)) that share a thread probe, in order: one
    method with the same drafter options (resolved, defaults included) drafts and verifies alike
    whatever its controller, so its entries get one probe and one count, not two noisy ones."""
    groups: list[tuple[tuple, list[str]]] = []
    for entry, (method, options) in wanted.items():
        key = (method, resolve(method, options).drafter_options.as_dict())
        members = next((m for k, m in groups if k == key), None)
        if members is None:
            groups.append((key, [entry]))
        else:
            members.append(entry)
    return [tuple(members) for _, members in groups]


def plan_profiles(wanted: dict[str, tuple[str, dict]], *, ar: bool, max_new_tokens: int, num_prompts: int,
                  counts=None) -> dict[str, ProfileJob]:
    """label -> ProfileJob, in the order to measure: for every group of `probe_groups(wanted)` (entry ->
    (method, options), each a drafting method: `has_thread_probe`) a probe at each thread count of
    `counts` (default `threads.thread_counts()`), then AR steps at each if `ar`, then one sized profile
    for each group with an entry whose controller reads costs, unless it is the probe. A group's probe
    is a cost profile's floor if one of its entries reads costs, else its first entry decoding as
    itself. Prefill them beside the run's methods, each at its `length`."""
    counts = threads.thread_counts() if counts is None else tuple(counts)
    ks, repeats = profile_size(max_new_tokens, num_prompts)
    groups = [(entries, tuple(e for e in entries if reads_costs(*wanted[e]))) for entries in probe_groups(wanted)]
    jobs = {}
    if ar:      # first: every later job's k = 0 rounds attend by the path these choose
        for t in counts:
            for path in AR_ATTENTION:
                jobs[f"AR steps @{t} threads, {path}"] = ProfileJob(AR, {}, MIN_AR_STEPS + 1, (AR,), t, (), path)
    for entries, priors in groups:
        method, options = wanted[priors[0] if priors else entries[0]]
        probe = profile_decoder(method, options, FLOOR_KS, 1) if priors else (method, options, cycle_tokens(FLOOR_KS, 1))
        for t in counts:
            jobs[f"thread probe of {' + '.join(entries)} @{t} threads"] = ProfileJob(*probe, entries, t, priors)
    if (ks, repeats) != (FLOOR_KS, 1):
        for entries, priors in groups:
            if priors:
                method, options = wanted[priors[0]]
                jobs[f"cost profile of {' + '.join(priors)}"] = ProfileJob(
                    *profile_decoder(method, options, ks, repeats), entries, None, priors)
    return jobs


def has_thread_probe(method: str) -> bool:
    """A method the run chooses threads for by a probe: every drafting method (AR has its AR steps)."""
    return method in METHODS and METHODS[method].drafts


def reads_costs(method: str, options: dict) -> bool:
    """Whether `method`'s controller, with `options`, starts from a cost profile (the entropy controller)."""
    return CONTROLLERS[resolve(method, options).controller].reads_costs


@dataclass
class RunCalibration:
    """What a run measured before decoding: cost priors by entry, thread choices by entry (AR's under
    "ar"), and the way every method's AR steps attend (`ar_attention`, the fastest of `ar_step_s`:
    path -> threads -> C_AR)."""
    priors: dict[str, CostProfile] = field(default_factory=dict)
    choices: dict[str, thread_choice.ThreadChoice] = field(default_factory=dict)
    ar_attention: str = DEFAULT_AR_ATTENTION
    ar_step_s: dict[str, dict[int, float]] = field(default_factory=dict)

    def choose_ar(self, measured: dict[tuple[int, str], float]) -> None:
        """From C_AR by (threads, attention path): AR's thread count (its fastest path at each count
        compared) and, at that count, the fastest path, which every method's AR steps then take."""
        counts = sorted({t for t, _ in measured})
        self.choices[AR] = thread_choice.choose({t: min(s for (u, _), s in measured.items() if u == t) for t in counts},
                                          "C_AR, the fastest attention path at each count")
        at = {path: s for (t, path), s in measured.items() if t == self.choices[AR].threads}
        self.ar_attention = min(AR_ATTENTION, key=lambda p: at.get(p, float("inf")))
        self.ar_step_s = {path: {t: s for (t, p), s in sorted(measured.items()) if p == path}
                          for path in AR_ATTENTION if any(p == path for _, p in measured)}

    def ar_variants(self) -> dict | None:
        """What summary.json records of AR's variants (None: none was measured)."""
        if not self.ar_step_s:
            return None
        return {"ar_attention": self.ar_attention, "threads": self.choices[AR].threads,
                "ar_step_s": {p: {str(t): s for t, s in by.items()} for p, by in self.ar_step_s.items()}}

    def get(self, entry: str) -> CostProfile | None:
        return self.priors.get(entry)

    def __contains__(self, entry: str) -> bool:
        """Whether `entry` is calibrated: its threads chosen (and its prior measured, if it reads costs)."""
        return entry in self.priors or entry in self.choices

    def choose_for(self, entries: tuple[str, ...], choice: thread_choice.ThreadChoice) -> None:
        """Record one probe's `choice` for every entry that shared it."""
        for entry in entries:
            self.choices[entry] = choice

    def threads_for(self, label: str, method: str) -> int | None:
        """The count a decoder decodes with (None: the process's own, nothing was measured for it)."""
        choice = self.choices.get(AR if method == AR else label)
        return None if choice is None else choice.threads


def measure_planned(model, prompts: list, starts: list[dict], jobs: dict[str, ProfileJob],
                    calibration: RunCalibration) -> None:
    """Decode every job of `plan_profiles` on `prompts` (one prompt: a batch of one) from its start
    (`starts`: one dict label -> Prefilled per prompt): the probes and AR steps at their counts, then each sized profile at
    the count its probes chose. Records in `calibration` each entry's thread choice and, for an entry
    that reads costs, its prior (the sized profile, or the chosen count's probe when there is none)."""
    run = PlannedDecodes(model, prompts, starts, calibration)
    probes, decode_s = measure_at_counts(run, jobs, calibration)
    choose_counts(jobs, probes, decode_s, calibration)
    for label, job in jobs.items():
        if job.threads is None:
            measure_sized(run, label, job, calibration)


class PlannedDecodes:
    """The calibration's decodes, each from its own start of the shared prefill (one per prompt)."""

    def __init__(self, model, prompts: list, starts: list[dict], calibration: RunCalibration):
        self.model, self.prompts, self.starts, self.calibration = model, prompts, starts, calibration

    def start_of(self, label: str) -> list:
        return [s.pop(label) for s in self.starts]

    def decoded(self, label: str, ar_attention: str | None = None):
        return generate(self.model, self.prompts, prefilled=self.start_of(label), stop_at_eos=False,
                        ar_attention=ar_attention or self.calibration.ar_attention,
                        threads=torch.get_num_threads(),     # measured at the count it is run at
                        remember=False)                      # the calibration is its own evidence

    def profile(self, label: str) -> CostProfile:
        return measure_cost_profile(self.model, self.prompts, prefilled=self.start_of(label),
                                    ar_attention=self.calibration.ar_attention)


def measure_at_counts(run: PlannedDecodes, jobs: dict[str, ProfileJob], calibration: RunCalibration):
    """The AR steps (first: AR's path is chosen from them before any later k = 0 round runs), then
    each probe, at its thread count -> (probes: entries -> count -> CostProfile, decode_s: entries ->
    count -> seconds of a probe that reads no costs)."""
    probes, decode_s, ar_steps = defaultdict(dict), defaultdict(dict), {}
    for label, job in jobs.items():
        if job.threads is None:
            continue
        if job.method != AR and ar_steps and AR not in calibration.choices:
            calibration.choose_ar(ar_steps)
        with threads.using(job.threads):
            if job.method == AR:
                ar_steps[job.threads, job.ar_attention] = thread_choice.ar_step_s(
                    full_batch_rounds(run.decoded(label, job.ar_attention)))
            elif job.costs:
                probes[job.entries][job.threads] = run.profile(label)
            else:   # the same rounds at each count: their decode seconds compare (drafts or none)
                decode_s[job.entries][job.threads] = run.decoded(label).decode_s
    if ar_steps and AR not in calibration.choices:
        calibration.choose_ar(ar_steps)
    return probes, decode_s


def choose_counts(jobs: dict[str, ProfileJob], probes: dict, decode_s: dict, calibration: RunCalibration) -> None:
    """Each probe group's count (the least decode seconds, or the least profiled work W with the mixed
    plan beside it), and the chosen count's probe as the prior of the group's cost readers."""
    for entries, by_count in decode_s.items():
        calibration.choose_for(entries, thread_choice.choose(by_count, "the probe's decode seconds", shared_by=entries))
    counts = sorted({job.threads for job in jobs.values() if job.threads is not None})
    switch_s = threads.switch_cost_s(tuple(counts)) if len(counts) > 1 and probes else None
    priors_of = {job.entries: job.priors for job in jobs.values()}
    for entries, by_count in probes.items():
        choice = thread_choice.choose({t: thread_choice.profile_work_s(p) for t, p in by_count.items()},
                                      "W = sum_k (k C_d + C_v(k))", thread_choice.mixed_plan(by_count, switch_s),
                                      shared_by=entries)
        calibration.choose_for(entries, choice)
        for entry in priors_of[entries]:
            calibration.priors[entry] = by_count[choice.threads]


def measure_sized(run: PlannedDecodes, label: str, job: ProfileJob, calibration: RunCalibration) -> None:
    """A sized cost profile at the count its group's probes chose: the prior of the group's cost readers."""
    with threads.using(calibration.choices[job.entries[0]].threads):
        profile = run.profile(label)
    for entry in job.priors:
        calibration.priors[entry] = profile
