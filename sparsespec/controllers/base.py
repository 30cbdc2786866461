"""The controller contract: how many tokens to draft each round, one `Controller` subclass per rule.

The decode loop talks to a controller through these calls, all batch-shaped (one sequence is a
batch of one; a batch drafts one k for every sequence):
    max_k                         -> the most tokens a round may draft (the caches are sized for it)
    use_cost_prior(profile)       -> start from measured costs (a `CostProfile`, cost_profile.py)
    start_round(limit)            -> a new round; at most `limit` tokens may be drafted. Returns the
                                     round's draft limit: 0 means no draft (one plain AR step)
    keep_drafting_batch(entropies)-> after each draft step (entropies[b]: sequence b's draft
                                     entropies this round): draft another?
    submit_count(drafted)         -> how many of the drafted tokens go to verification
    observe_batch(entropies, accepted, submitted, draft_step_s, verify_s, round_s)
                                  -> what verification decided, per sequence; the costs are the batch's
    trace()                       -> what the controller believed this round, for `Round`

Every one of them is abstract here: a registered controller (one with a `name`) that leaves one
out fails when its class is defined, not mid-run. One sequence calls them as a batch
of one (`keep_drafting_batch([entropies])`, `observe_batch([entropies], [accepted], ...)`).
"""
from __future__ import annotations

import abc
from typing import ClassVar, Sequence

from sparsespec.errors import ConfigError
from sparsespec.options import OptionSet

CONTROLLERS: dict[str, type["Controller"]] = {}   # name -> class, filled as classes are defined


class Controller(abc.ABC):
    """Base of every controller: declares `name`, its `Options`, whether it reads draft entropy,
    and the round protocol (module docstring). A new controller is one subclass, registered by its
    `name`; no drafter or loop changes."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[OptionSet]]
    uses_entropy: ClassVar[bool] = False      # True: meaningless for drafters whose drafts have no entropy
    reads_costs: ClassVar[bool] = False       # True: chooses from measured costs, so a run profiles them first

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):      # an intermediate base, or a variant of a registered
            return                            # controller: not registered (a base may stay abstract)
        missing = sorted(n for n in PROTOCOL if getattr(getattr(cls, n, None), "__isabstractmethod__", False))
        if missing:
            raise TypeError(f"controller {cls.name!r} ({cls.__qualname__}) does not implement {missing}")
        CONTROLLERS[cls.name] = cls

    def __init__(self, **options):
        self.opts = self.Options.build(options, owner=f"controller {self.name!r}")

    @property
    @abc.abstractmethod
    def max_k(self) -> int:
        """The most tokens one round may draft."""

    @abc.abstractmethod
    def use_cost_prior(self, profile) -> None:
        """Start from measured costs (`sparsespec.controllers.cost_profile.CostProfile`); a controller that
        ignores costs ignores it."""

    @abc.abstractmethod
    def start_round(self, limit: int) -> int:
        """A new round in which at most `limit` tokens may be drafted; returns the round's draft
        limit (<= `limit`; 0: the round drafts nothing, one plain AR step)."""

    @abc.abstractmethod
    def keep_drafting_batch(self, entropies: Sequence[Sequence[float]]) -> bool:
        """`entropies[b]`: sequence b's draft entropies this round (all the same length, >= 1).
        Draft another token? A controller that does not read entropy decides on the count alone."""

    @abc.abstractmethod
    def submit_count(self, drafted: int) -> int:
        """How many of the `drafted` tokens go to verification."""

    @abc.abstractmethod
    def observe_batch(self, entropies: Sequence[Sequence[float]], accepted: Sequence[int], submitted: int,
                      draft_step_s: float | None, verify_s: float, round_s: float | None = None) -> None:
        """What one verification decided: `accepted[b]` of the `submitted` drafts of sequence b
        (`entropies[b]` theirs); the seconds of one draft step (None: none ran), of the
        verification, and of the whole round (KV selection, every draft step run, verification;
        None: not timed), the batch's."""

    @abc.abstractmethod
    def trace(self) -> dict:
        """`Round` fields describing what the controller believed this round ({} for none)."""


# the names every registered controller implements: `Controller`'s abstract members
PROTOCOL = frozenset(n for n, v in vars(Controller).items() if getattr(v, "__isabstractmethod__", False))


def make_controller(name: str, **options) -> Controller:
    """The controller registered as `name`, built with `options` (checked by its `Options`)."""
    if name not in CONTROLLERS:
        raise ConfigError(f"unknown controller {name!r}; accepted: {sorted(CONTROLLERS)}")
    return CONTROLLERS[name](**options)
