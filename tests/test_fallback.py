"""The choice of plain decoding (k = 0): the rule on hand-computed rates, and the entropy
controller's rounds that follow it."""
from __future__ import annotations

import pytest

from sparsespec.calibration import CostProfile
from sparsespec.controllers import EntropyController
from sparsespec.controllers.fallback import AR_PROBE, FALLBACK, PROBE, SPECULATE, PlainFallback


def step(rule: PlainFallback, tokens: float, seconds: float) -> str:
    """One round: the rule's choice, then the round measured (k = 0 when the choice is plain)."""
    choice = rule.choose()
    plain = choice in (FALLBACK, AR_PROBE)
    rule.observe(choice, 0 if plain else 4, 1.0 if plain else tokens, seconds if not plain else 0.10)
    return choice


def test_the_first_round_measures_ar_then_speculation_runs_while_it_is_faster():
    rule = PlainFallback(window=5, probe_every=2, probe_max=4)
    assert step(rule, 0, 0) == AR_PROBE
    assert rule.cost_ar() == pytest.approx(0.10) and rule.ar_rate() == pytest.approx(10.0)   # A = 1 / 0.10
    for _ in range(3):                    # 3 tokens in 0.2 s: S = 15 tokens/s > A = 10
        assert step(rule, 3, 0.2) == SPECULATE
    assert rule.speculation_rate() == pytest.approx(15.0)


def test_one_slow_round_is_ignored_and_a_lasting_slowdown_falls_back_within_three_rounds():
    rule = PlainFallback(window=5, probe_every=2, probe_max=4)
    step(rule, 0, 0)
    for _ in range(3):
        step(rule, 3, 0.2)
    assert step(rule, 3, 2.0) == SPECULATE          # seconds [.2 .2 .2 2.0]: median 0.2, S = 15
    assert not rule.falling_back
    # load: every round 0.5 s. Window (5) after each: [.2 .2 .2 2 .5] median .2 -> S 15;
    # [.2 .2 2 .5 .5] median .5 -> S = 3 / 0.5 = 6 < A = 10: fallback after the second loaded round
    assert step(rule, 3, 0.5) == SPECULATE and not rule.falling_back
    assert step(rule, 3, 0.5) == SPECULATE and rule.falling_back
    assert rule.speculation_rate() == pytest.approx(6.0)


def loaded(rule: PlainFallback) -> PlainFallback:
    """A rule that just fell back: A = 10 tokens/s; ceil(W/2) speculative rounds, each 3 tokens in
    0.5 s (S = 6), the fewest it trusts."""
    step(rule, 0, 0)
    for _ in range(rule.needed):
        assert not rule.falling_back
        step(rule, 3, 0.5)
    assert rule.falling_back and rule.idle == 0
    return rule


def test_probes_back_off_while_speculation_keeps_losing():
    rule = loaded(PlainFallback(window=5, probe_every=2, probe_max=4))
    # wait 2: two AR rounds, a probe (6 tokens/s < 10: lost), wait doubles to 4, then 4 AR rounds,
    # a probe, and the wait stays at probe_max = 4
    choices = [step(rule, 3, 0.5) for _ in range(13)]
    assert choices == [FALLBACK, FALLBACK, PROBE, FALLBACK, FALLBACK, FALLBACK, FALLBACK, PROBE,
                       FALLBACK, FALLBACK, FALLBACK, FALLBACK, PROBE]
    assert rule.wait == 4


def test_when_the_load_drops_good_probes_follow_each_other_until_speculation_wins_again():
    rule = loaded(PlainFallback(window=5, probe_every=2, probe_max=4))
    assert [step(rule, 3, 0.5) for _ in range(2)] == [FALLBACK, FALLBACK]
    # quiet again: each probe 3 tokens in 0.2 s (15/s >= A). Window seconds after each probe:
    # [.5 .5 .5 .2] median .5, S 6: probe again; [.5 .5 .5 .2 .2] median .5: again;
    # [.5 .5 .2 .2 .2] median .2, S = 15 >= 10: speculation resumes
    assert [step(rule, 3, 0.2) for _ in range(4)] == [PROBE, PROBE, PROBE, SPECULATE]
    assert not rule.falling_back and rule.wait == 2


def test_rising_acceptance_brings_speculation_back_at_the_same_cost():
    rule = loaded(PlainFallback(window=3, probe_every=1, probe_max=1))
    # window 3: S = mean tokens / median seconds. 3 tokens in 0.5 s: 6/s. Acceptance rises: 8 tokens
    # in 0.5 s (16/s) per probe; tokens [3 3 8]: mean 14/3, S = 9.33 < 10: probe again;
    # [3 8 8]: mean 19/3, S = 12.67 >= 10: speculate
    assert step(rule, 8, 0.5) == FALLBACK
    assert [step(rule, 8, 0.5) for _ in range(3)] == [PROBE, PROBE, SPECULATE]


def test_after_a_warm_up_lost_in_one_round_only_probes_that_win_bring_speculation_back():
    """The warm-up's first round lost (the window holds one speculative round, not a full one): a
    probe as slow as it keeps plain decoding; good probes bring speculation back once S >= A."""
    rule = PlainFallback(window=5, probe_every=2, probe_max=4)
    step(rule, 0, 0)                                   # A = 10 tokens/s
    rule.observe("", 2, 2.0, 0.5)                      # the warm-up round: 2 tokens in 0.5 s, 4/s
    rule.fall_back()
    assert [step(rule, 2, 0.5) for _ in range(3)] == [FALLBACK, FALLBACK, PROBE]
    assert rule.falling_back and rule.wait == 4        # one slow probe: back to waiting, longer
    rule = PlainFallback(window=5, probe_every=2, probe_max=4)
    step(rule, 0, 0)
    rule.observe("", 2, 2.0, 0.5)
    rule.fall_back()
    # good probes, 3 tokens in 0.2 s (15/s): tokens [2 3], seconds [.5 .2]: S = 2.5 / 0.35 = 7.1 < 10,
    # probe again; [2 3 3], [.5 .2 .2]: S = 2.67 / 0.2 = 13.3 >= 10: speculate
    assert [step(rule, 3, 0.2) for _ in range(5)] == [FALLBACK, FALLBACK, PROBE, PROBE, SPECULATE]


def test_a_probe_within_the_margin_but_below_ar_is_not_followed_by_another():
    """A break-even probe (0.96 A: within the 0.95 margin, yet slower than AR) paid nothing back:
    plain decoding goes on and the wait doubles; a probe that beat AR is followed by another."""
    def after_one_probe(tokens: float) -> PlainFallback:
        rule = PlainFallback(window=5, probe_every=2, probe_max=8, margin=0.95)
        step(rule, 0, 0)                               # A = 10 tokens/s
        rule.observe("", 2, 1.0, 0.5)                  # a lost warm-up: 2/s
        rule.fall_back()
        assert [step(rule, tokens, 0.2) for _ in range(3)] == [FALLBACK, FALLBACK, PROBE]
        return rule
    even = after_one_probe(1.92)                       # 1.92 tokens in 0.2 s: 9.6/s = 0.96 A
    assert not even.probe_again and even.wait == 4 and even.choose() == FALLBACK
    beat = after_one_probe(2.2)                        # 11/s > A; S = 1.6 / 0.35 = 4.6 < 9.5: not yet
    assert beat.probe_again and beat.falling_back and beat.choose() == PROBE


def scripted_round(ctl: EntropyController, entropies, accepted, draft_step_s, verify_s, ar_s):
    """One round of the loop against `ctl`: (start_round's limit, submitted, trace)."""
    limit = ctl.start_round(limit=16)
    drafted = 0
    while limit and drafted < len(entropies):
        drafted += 1
        if not ctl.keep_drafting_batch([entropies[:drafted]]):
            break
    k = ctl.submit_count(drafted) if limit else 0
    trace = ctl.trace()
    ctl.observe_batch([entropies[:k]], [min(accepted, k)], k, draft_step_s if k else None, verify_s if k else ar_s)
    return limit, k, trace


def test_the_entropy_controller_runs_a_fallback_round_as_no_draft_and_traces_why():
    ctl = EntropyController(warmup_rounds=0, cost_window=3, probe_every=1, probe_max=1, prior_k=2)
    ctl.c_draft, ctl.mu_acc, ctl.mu_rej = 0.01, 0.3, 3.0
    ctl.c_verify.add(1, 1.0)
    ctl.c_verify.add(4, 1.0)
    low = [0.3] * 16
    limit, k, trace = scripted_round(ctl, low, 16, 0.01, 1.0, ar_s=0.05)       # A = 20 tokens/s
    assert (limit, k, trace["choice"]) == (0, 0, AR_PROBE) and "survival" not in trace
    for _ in range(3):     # k <= 16 drafts, all accepted: at most 17 tokens in 16 * 0.01 + 1.0 s, < 20/s
        limit, k, trace = scripted_round(ctl, low, 16, 0.01, 1.0, ar_s=0.05)
        assert trace["choice"] == SPECULATE and k >= 1 and trace["cost_ar"] == pytest.approx(0.05)
    limit, k, trace = scripted_round(ctl, low, 16, 0.01, 1.0, ar_s=0.05)
    assert (limit, k, trace["choice"]) == (0, 0, FALLBACK)
    limit, k, trace = scripted_round(ctl, low, 16, 0.01, 1.0, ar_s=0.05)
    assert trace["choice"] == PROBE and k == 2                                    # a probe drafts a fixed k: here prior_k
    assert 0 not in ctl.c_verify.by_k                                             # C_AR is no point of C_v(k)


def test_without_fallback_the_rule_never_chooses_plain_decoding():
    ctl = EntropyController(warmup_rounds=0, fallback=False)
    ctl.c_draft, ctl.mu_acc, ctl.mu_rej = 0.01, 0.3, 3.0
    ctl.c_verify.add(1, 0.5)
    for _ in range(10):
        limit, k, trace = scripted_round(ctl, [0.3] * 16, 0, 0.01, 5.0, ar_s=0.001)
        assert limit > 0 and k >= 1 and "choice" not in trace


# --- like with like: whole rounds, a full window, a margin, a prior C_AR ------------------------

def test_speculation_is_judged_on_whole_rounds_selection_and_discarded_steps_included():
    # A = 10/s. Each round: 3 tokens; k C_d + C_v(k) = 0.25 s (12/s: wins), but the whole round,
    # with its KV selection and a discarded draft step, takes 0.4 s (7.5/s: loses)
    ctl = EntropyController(warmup_rounds=0, cost_window=3, fallback_margin=1.0)
    ctl.c_draft, ctl.mu_acc, ctl.mu_rej = 0.01, 0.3, 3.0
    ctl.c_verify.add(1, 0.2)
    ctl.plain.seed_ar(0.10)
    for _ in range(3):
        assert ctl.start_round(limit=16) > 0
        ctl.observe_batch([[0.3] * 5], [2], 5, 0.01, 0.2, round_s=0.4)
    assert ctl.plain.falling_back and ctl.plain.speculation_rate() == pytest.approx(7.5)


def test_a_run_whose_whole_rounds_beat_ar_never_falls_back_even_through_spikes():
    ctl = EntropyController(warmup_rounds=0, cost_window=5)
    ctl.c_draft, ctl.mu_acc, ctl.mu_rej = 0.01, 0.3, 3.0
    ctl.c_verify.add(1, 0.2)
    ctl.plain.seed_ar(0.10)                                       # A = 10/s
    for i in range(60):   # 3 tokens in 0.28 s (10.7/s > A); every fifth round a 2 s spike
        assert ctl.start_round(limit=16) > 0 and ctl.trace()["choice"] == SPECULATE
        ctl.observe_batch([[0.3] * 2], [2], 2, 0.01, 0.2, round_s=2.0 if i % 5 == 4 else 0.28)
    assert not ctl.plain.falling_back


def test_a_bad_start_followed_by_good_rounds_within_the_window_does_not_fall_back():
    rule = PlainFallback(window=5, probe_every=2, probe_max=4, margin=0.95)
    assert step(rule, 0, 0) == AR_PROBE                          # A = 10/s
    # three rounds of rejected drafts: 1 token in 0.2 s (5/s), then good ones: 5 tokens in 0.2 s.
    # Judged at the full window only: tokens [1 1 1 5 5], mean 2.6, median 0.2 s: S = 13 >= 9.5
    choices = [step(rule, 1, 0.2) for _ in range(3)] + [step(rule, 5, 0.2) for _ in range(10)]
    assert choices == [SPECULATE] * 13 and not rule.falling_back


def test_the_same_bad_start_would_have_fallen_back_when_judged_on_half_a_window():
    rule = PlainFallback(window=5, probe_every=2, probe_max=4, margin=0.95)
    rule.needed = 3                                               # the former rule: ceil(W/2) rounds
    step(rule, 0, 0)
    for _ in range(3):
        step(rule, 1, 0.2)
    assert rule.falling_back


def test_speculation_within_the_margin_of_ar_goes_on_and_below_it_falls_back():
    within = PlainFallback(window=3, probe_every=2, probe_max=4, margin=0.95)
    step(within, 0, 0)                                            # A = 10/s
    for _ in range(6):
        step(within, 0.97, 0.1)                                   # S = 9.7/s: below A, above 0.95 A
    assert not within.falling_back
    below = PlainFallback(window=3, probe_every=2, probe_max=4, margin=0.95)
    step(below, 0, 0)
    for _ in range(3):
        step(below, 0.93, 0.1)                                    # S = 9.3/s < 9.5/s
    assert below.falling_back


def test_a_prior_c_ar_opens_speculating_and_measured_ar_rounds_replace_it():
    rule = PlainFallback(window=3, probe_every=1, probe_max=1)
    rule.seed_ar(0.05)
    assert rule.choose() == SPECULATE and rule.cost_ar() == pytest.approx(0.05)
    for _ in range(3):
        rule.observe(FALLBACK, 0, 1.0, 0.2)
    assert rule.cost_ar() == pytest.approx(0.2)                   # the prior is out of the window


def entropy_with_profile(ar_step_s):
    ctl = EntropyController()
    ctl.use_cost_prior(CostProfile(draft_step_s=0.01, verify_s={1: 0.1, 2: 0.11}, ar_step_s=ar_step_s,
                                   accepted_entropy=0.3, rejected_entropy=3.0, acceptance_rate=0.8))
    return ctl


def test_with_a_profiled_c_ar_the_first_round_speculates_and_without_it_measures_ar():
    ctl = entropy_with_profile(0.05)
    assert ctl.start_round(limit=16) > 0 and ctl.trace()["choice"] == SPECULATE
    assert ctl.trace()["cost_ar"] == pytest.approx(0.05)
    ctl = entropy_with_profile(None)
    assert ctl.start_round(limit=16) == 0 and ctl.trace()["choice"] == AR_PROBE
