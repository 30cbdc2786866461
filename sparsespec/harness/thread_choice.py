"""How many CPU threads each method decodes with, chosen by measurement.

Speculation is many small multi-row matmuls. With several OpenMP threads each one waits for every
thread, so a core busy with another process stalls a verification for a scheduler time slice, while
one thread does not wait at all; on a quiet machine the threads may still pay. Neither is known in
advance, so a run measures both: a probe of its cost profile (one round at k = 1, 2;
sparsespec/harness/calibration.py) and a few AR steps are decoded at each of `thread_counts()` (1 and the
process's default), from the same prefill, and every method decodes with its own faster setting, AR
included (the speed-up's denominator is never a handicapped AR). Entries that draft and verify alike
(one method, the same drafter options, any controller: `calibration.probe_groups`) share one probe and
its setting; `ThreadChoice.probe_shared_by` names them.

The settings are compared on the same work, so the comparison is paired:

    AR:          C_AR(t)                                  median seconds of one AR step at t threads
    entropy:     W(t) = sum over profiled k of (k C_d(t) + C_v(k, t))   one round at each k
    other drafting methods (a controller that ignores costs: fixed k, ...):
                 D(t) = decode seconds of the method's own probe generation (same tokens at each t)
    choice:      argmin over t; a tie goes to fewer threads (a core left free)

Drafting (one row a step) and verification (k + 1 rows) may prefer different counts. `torch.set_num_threads`
between them costs `switch_cost_s()`; `mixed_plan` says whether drafting at one count and verifying at
another would beat the single choice by more than two switches a round, and the summary records it
(recorded, not applied: the decode loop sets one count for a whole generation).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

from sparsespec.threads import thread_counts, using

@dataclass
class ThreadChoice:
    """One method's measured cost at each thread count (seconds of the same work) and the count chosen."""
    threads: int
    cost_s: dict[int, float]
    measured: str            # what `cost_s` is: "C_AR" or "W = sum_k (k C_d + C_v(k))"
    mixed: dict | None = None
    probe_shared_by: tuple[str, ...] = ()   # the run's entries this one probe chose for (AR's steps: none)

    def as_dict(self) -> dict:
        return {**asdict(self), "cost_s": {str(t): s for t, s in sorted(self.cost_s.items())},
                "probe_shared_by": list(self.probe_shared_by)}


def choose(cost_s: dict[int, float], measured: str, mixed: dict | None = None,
           shared_by: tuple[str, ...] = ()) -> ThreadChoice:
    """The count with the least cost; a tie goes to fewer threads. `shared_by`: the entries it is for."""
    best = min(sorted(cost_s), key=lambda t: cost_s[t])
    return ThreadChoice(threads=best, cost_s=dict(cost_s), measured=measured, mixed=mixed,
                        probe_shared_by=tuple(shared_by))


def ar_step_s(rounds: list) -> float:
    """C_AR: median seconds of one AR step, over an AR generation's `rounds` (each verifies one row
    a sequence; a batch's round times are the batch's)."""
    return statistics.median(r.seconds for r in rounds)      # `Round.seconds`: the whole round


def profile_work_s(profile) -> float:
    """W: one round at each profiled k, from a `CostProfile`."""
    return sum(k * profile.draft_step_s + v for k, v in profile.verify_s.items())


def mixed_plan(profiles: dict, switch_s: float) -> dict | None:
    """Draft at one count and verify at another, when that beats every single count by more than the
    two switches a round costs. `profiles`: threads -> `CostProfile` (same ks at every count)."""
    if len(profiles) < 2:
        return None
    draft_t = min(profiles, key=lambda t: profiles[t].draft_step_s)
    verify_t = min(profiles, key=lambda t: sum(profiles[t].verify_s.values()))
    if draft_t == verify_t:
        return None
    ks = profiles[verify_t].verify_s
    work = sum(k * profiles[draft_t].draft_step_s + profiles[verify_t].verify_s[k] for k in ks)
    work += 2 * switch_s * len(ks)
    best_single = min(profile_work_s(p) for p in profiles.values())
    return {"draft_threads": draft_t, "verify_threads": verify_t, "work_s": work, "switch_s": switch_s,
            "pays": work < best_single}
