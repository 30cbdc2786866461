"""The controller contract: an abstract base that refuses an incomplete controller at class
definition, one factory, and batch calls on identical copies of a sequence that decide as on the
sequence alone (a batch of one)."""
from __future__ import annotations

import random

import pytest

from sparsespec.controllers import CONTROLLERS, PROTOCOL, Controller, FixedK, make_controller
from sparsespec.errors import ConfigError


def complete_members() -> dict:
    """Every protocol member, implemented trivially."""
    return {"max_k": property(lambda self: 1), "use_cost_prior": lambda self, profile: None,
            "start_round": lambda self, limit: min(1, limit), "keep_drafting_batch": lambda self, e: False,
            "submit_count": lambda self, drafted: drafted, "trace": lambda self: {},
            "observe_batch": lambda self, entropies, accepted, submitted, draft_step_s, verify_s, round_s=None: None}


def test_the_protocol_is_the_batch_shaped_one():
    assert PROTOCOL == {"max_k", "use_cost_prior", "start_round", "keep_drafting_batch", "submit_count",
                        "observe_batch", "trace"}
    assert not hasattr(Controller, "keep_drafting") and not hasattr(Controller, "observe")   # no second form


@pytest.mark.parametrize("missing", sorted(PROTOCOL))
def test_a_controller_missing_a_protocol_method_fails_at_class_definition(missing):
    members = complete_members()
    del members[missing]
    with pytest.raises(TypeError, match=rf"does not implement \['{missing}'\]"):
        type("Incomplete", (Controller,), {"name": f"incomplete_{missing}", **members})
    assert f"incomplete_{missing}" not in CONTROLLERS


def test_a_complete_controller_registers_and_an_unnamed_base_may_stay_abstract():
    type("PartialBase", (Controller,), {})                        # no name: an intermediate base
    type("Variant", (CONTROLLERS["entropy"],), {})                 # inherits a name: not registered over it
    assert CONTROLLERS["entropy"].__name__ == "EntropyController"
    cls = type("Complete", (Controller,), {"name": "complete_for_test", "Options": FixedK.Options,
                                           **complete_members()})
    try:
        assert CONTROLLERS["complete_for_test"] is cls
        assert isinstance(make_controller("complete_for_test"), cls)
    finally:
        del CONTROLLERS["complete_for_test"]


def test_the_factory_refuses_an_unknown_name_in_one_line():
    with pytest.raises(ConfigError, match=r"unknown controller 'magic'; accepted: \['cycle', 'entropy'"):
        make_controller("magic")


def primed(name: str):
    """A controller whose rule is in charge from round one (entropy: costs and centres known)."""
    c = make_controller(name, **({"warmup_rounds": 0} if name == "entropy" else {}))
    if name == "entropy":
        c.c_draft, c.mu_acc, c.mu_rej = 0.01, 0.5, 2.5
        for k, s in ((1, 0.05), (4, 0.06), (8, 0.08)):
            c.c_verify.add(k, s)
    return c


def drive(controller, rounds, batch_of: int):
    """Run scripted rounds through the batch calls on `batch_of` copies of the sequence; the
    decisions and traces, round by round."""
    out = []
    for limit, entropies, accepted, draft_s, verify_s in rounds:
        limit = controller.start_round(limit)
        drafted = 0
        while drafted < len(entropies) and drafted < max(limit, 1):
            drafted += 1
            seen = entropies[:drafted]
            if not controller.keep_drafting_batch([seen] * batch_of):
                break
        k = controller.submit_count(drafted) if limit else 0
        a = min(accepted, k)
        trace = controller.trace()
        controller.observe_batch([entropies[:k]] * batch_of, [a] * batch_of, k, draft_s if k else None, verify_s)
        out.append((limit, drafted, k, trace))
    return out


@pytest.mark.parametrize("name", sorted(n for n in CONTROLLERS if n in ("fixed", "cycle", "heuristic", "entropy")))
def test_a_batch_of_identical_copies_decides_as_a_batch_of_one(name):
    rng = random.Random(7)
    rounds = [(rng.choice([16, 16, 16, 3, 0]), [rng.uniform(0, 4) for _ in range(16)], rng.randint(0, 16),
               rng.uniform(0.005, 0.02), rng.uniform(0.04, 0.1)) for _ in range(40)]
    single = drive(primed(name), rounds, 1)
    # copies of one sequence: the same k (pibar of equal sequences is pi). The entropy controller
    # learns from every sequence, so copies count as more evidence: compare it round by round from
    # the same state; the count controllers over the whole script
    scripts = [[r] for r in rounds] if name == "entropy" else [rounds]
    for script in scripts:
        alone, copies = drive(primed(name), script, 1), drive(primed(name), script, 3)
        assert [r[:3] for r in copies] == [r[:3] for r in alone]
        for (_, _, _, a), (_, _, _, b) in zip(alone, copies):
            assert a.keys() == b.keys() and all(a[f] == pytest.approx(b[f]) for f in a)
    assert len({k for _, _, k, _ in single}) > 1 or name == "fixed"           # the script moved k
