"""The entropy controller's math on hand-computed cases, its online rule, and its traces."""
from __future__ import annotations

import math
import random

import pytest
import torch

import sparsespec
from conftest import build_tiny, random_prompt
from sparsespec.calibration import CostProfile, measure_cost_profile
from sparsespec.controllers import CycleK, EntropyController, FixedK
from sparsespec.controllers.acceptance import paper_acceptance, with_base_rate
from sparsespec.controllers.cost_models import choose_k, expected_ratio, survival


def test_acceptance_probability_at_the_centres_and_halfway():
    mu_acc, mu_rej = 1.0, 3.0
    at_acc = 1 / (1 + math.exp(-2))          # |H-mu_acc| = 0, |H-mu_rej| = 2
    assert paper_acceptance(1.0, mu_acc, mu_rej) == pytest.approx(at_acc)
    assert paper_acceptance(3.0, mu_acc, mu_rej) == pytest.approx(1 - at_acc)
    assert paper_acceptance(2.0, mu_acc, mu_rej) == pytest.approx(0.5)
    assert paper_acceptance(-5.0, mu_acc, mu_rej) == pytest.approx(at_acc)  # beyond a centre: saturates


def test_base_rate_reweights_the_equal_prior_posterior():
    assert with_base_rate(0.5, 0.9) == pytest.approx(0.9)      # entropy undecided: the base rate
    assert with_base_rate(0.8, 0.5) == pytest.approx(0.8)      # even prior: the paper's p
    # p = 0.6, rate = 0.75: 0.75*0.6 / (0.75*0.6 + 0.25*0.4) = 0.45 / 0.55
    assert with_base_rate(0.6, 0.75) == pytest.approx(0.45 / 0.55)
    ctl = EntropyController(acceptance_prior=True, acceptance_model="paper")
    ctl.mu_acc, ctl.mu_rej, ctl.n_accepted, ctl.n_rejected = 0.5, 2.5, 28, 8   # rate (28+1)/(36+2)
    assert ctl.acceptance(0.5) == pytest.approx(with_base_rate(paper_acceptance(0.5, 0.5, 2.5), 29 / 38))
    ctl.acceptance_prior = False
    assert ctl.acceptance(0.5) == pytest.approx(paper_acceptance(0.5, 0.5, 2.5))


def test_survival_is_the_running_product():
    assert survival([0.9, 0.5, 0.2]) == pytest.approx([0.9, 0.45, 0.09])


def test_k_star_for_a_given_cost_ratio():
    # p = 0.8 everywhere, C_d = 1, C_v = 2 (flat): R(k) = (1 + sum 0.8^m) / (k + 2)
    probs = [0.8] * 8
    ratios = [expected_ratio(survival(probs), k, 1.0, lambda k: 2.0) for k in range(1, 9)]
    # by hand: R(1)=1.8/3=0.600, R(2)=2.44/4=0.610, R(3)=2.952/5=0.590
    assert ratios[:3] == pytest.approx([0.6, 0.61, 0.5904])
    assert choose_k(probs, range(1, 9), 1.0, lambda k: 2.0) == 2


def test_efficiency_inversion_more_expensive_drafts_mean_shorter_k():
    probs = [0.9] * 16
    ks = [choose_k(probs, range(1, 17), c_d, lambda k: 1.0) for c_d in (0.01, 0.05, 0.2, 1.0)]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1]


def test_equal_centres_keep_the_prior_k():
    ctl = EntropyController(prior_k=5, warmup_rounds=0, acceptance_model="paper", fallback=False)
    ctl.mu_acc = ctl.mu_rej = 1.2
    ctl.c_draft = 0.01
    ctl.c_verify.add(4, 0.1)
    assert run_online(ctl, [0.3] * 100) == (5, 5)


def run_online(ctl: EntropyController, entropies, limit=100) -> tuple[int, int]:
    """Feed entropies one draft token at a time; return (tokens drafted, tokens submitted)."""
    ctl.start_round(limit=limit)
    seen = []
    for h in entropies:
        seen.append(torch.tensor(h))
        if not ctl.keep_drafting_batch([seen]):
            break
    return len(seen), ctl.submit_count(len(seen))


def random_controller(rng: random.Random, lookahead: str, fit: str = "line",
                      keep_drafted: bool = False) -> tuple[EntropyController, list[int]]:
    """A controller past warm-up with random candidates, entropy centres and costs (for the hull,
    measured at several k, convex or not); by default submitting the closed form's k*."""
    candidates = sorted(rng.sample(range(1, 17), rng.randint(2, 10)))
    ctl = EntropyController(candidates=candidates, warmup_rounds=0, lookahead=lookahead, verify_cost_fit=fit,
                            fallback=False, keep_drafted=keep_drafted)
    ctl.mu_acc, ctl.mu_rej = rng.uniform(0, 1), rng.uniform(1.5, 4)
    ctl.c_draft = rng.uniform(0.005, 0.5)
    seconds = rng.uniform(0.1, 1.0)
    for k in ((2, 8) if fit == "line" else sorted(rng.sample(range(1, 17), rng.randint(2, 6)))):
        ctl.c_verify.add(k, seconds)
        seconds += rng.uniform(0, 0.5)
    return ctl, candidates


@pytest.mark.parametrize("fit", ["line", "hull"])
@pytest.mark.parametrize("seed", range(40))
def test_online_rule_chooses_the_closed_form_k(seed, fit):
    """Exact for an affine C_v (R is unimodal) and for the hull's convex one (concave over convex)."""
    rng = random.Random(seed)
    ctl, candidates = random_controller(rng, "exact", fit)
    entropies = [rng.uniform(0, 4) for _ in range(16)]
    probs = [ctl.acceptance(h) for h in entropies]
    closed = choose_k(probs, candidates, ctl.c_draft, ctl.c_verify)
    drafted, submitted = run_online(ctl, entropies)
    assert submitted == closed
    assert drafted <= max(candidates)                 # never drafts past max(K)
    assert drafted >= closed


@pytest.mark.parametrize("seed", range(20))
def test_predictive_lookahead_wastes_no_draft_step_when_entropy_is_steady(seed):
    """lookahead="predict" assumes p stays at its last value; when it does, the choice is the
    closed form's and no drafted token is thrown away."""
    rng = random.Random(seed)
    ctl, candidates = random_controller(rng, "predict")
    entropies = [rng.uniform(0, 4)] * 16
    closed = choose_k([ctl.acceptance(h) for h in entropies], candidates, ctl.c_draft, ctl.c_verify)
    assert run_online(ctl, entropies) == (closed, closed)


def test_online_rule_stops_early_on_a_high_entropy_token():
    ctl = EntropyController(candidates=range(1, 17), warmup_rounds=0, acceptance_model="paper", fallback=False,
                            keep_drafted=False)
    ctl.mu_acc, ctl.mu_rej, ctl.c_draft = 0.2, 3.0, 0.02
    ctl.c_verify.add(4, 0.2)
    drafted, submitted = run_online(ctl, [0.2, 0.2, 0.2, 6.0, 0.2, 0.2, 0.2, 0.2])
    assert submitted == 3 and drafted == 4            # the high-entropy 4th token was drafted, not sent


def test_a_drafted_token_is_sent_when_verifying_it_costs_nothing():
    """keep_drafted: the 4th draft step is paid, and with a flat C_v verifying it is free, so any
    chance of acceptance (pi_4 > 0) makes submitting it pay."""
    ctl = EntropyController(candidates=range(1, 17), warmup_rounds=0, acceptance_model="paper", fallback=False)
    ctl.mu_acc, ctl.mu_rej, ctl.c_draft = 0.2, 3.0, 0.02
    ctl.c_verify.add(4, 0.2)
    assert run_online(ctl, [0.2, 0.2, 0.2, 6.0, 0.2, 0.2, 0.2, 0.2]) == (4, 4)


def test_a_drafted_token_is_dropped_when_verifying_it_costs_more_than_it_brings():
    """A steep C_v: verifying a 4th token costs more than its small pi_4 is worth, paid step or not."""
    ctl = EntropyController(candidates=range(1, 17), warmup_rounds=0, acceptance_model="paper", fallback=False)
    ctl.mu_acc, ctl.mu_rej, ctl.c_draft = 0.2, 3.0, 0.02
    ctl.c_verify.add(1, 0.2)
    ctl.c_verify.add(8, 3.0)                          # 0.4 s a verified token
    assert run_online(ctl, [0.2, 0.2, 0.2, 6.0, 0.2, 0.2, 0.2, 0.2])[1] < 4


@pytest.mark.parametrize("fit", ["line", "hull"])
@pytest.mark.parametrize("seed", range(20))
def test_kept_drafts_draft_as_the_rule_and_submit_the_best_paid_ratio(seed, fit):
    """keep_drafted changes what is submitted, never how far the rule drafts: the same draft steps as
    the closed-form submission, and the candidate in [k*, drafted] with the most expected tokens per
    second of the round actually paid for (j draft steps), computed here from the formula."""
    rng = random.Random(seed)
    ctl, candidates = random_controller(rng, "exact", fit, keep_drafted=True)
    twin = random_controller(random.Random(seed), "exact", fit)[0]
    entropies = [rng.uniform(0, 4) for _ in range(16)]
    drafted, submitted = run_online(ctl, entropies)
    twin_drafted, closed = run_online(twin, entropies)
    assert drafted == twin_drafted
    pis, acc = [], 1.0
    for h in entropies[:drafted]:
        acc *= ctl.acceptance(h)
        pis.append(acc)
    paid = {c: (1 + sum(pis[:c])) / (drafted * ctl.c_draft + ctl.c_verify(c)) for c in candidates if closed <= c <= drafted}
    best = max(paid.values())
    assert submitted == min(c for c, r in paid.items() if r == best)
    assert submitted >= closed


def test_selection_seconds_are_learnt_and_favour_longer_drafts():
    """C_s (a round's seconds beyond draft and verify) is learnt from the round's whole seconds, and
    a fixed cost per round makes a longer draft pay: k* never falls as C_s grows."""
    ctl = EntropyController(candidates=range(1, 17), warmup_rounds=0, fallback=False)
    ctl.start_round(limit=8)
    for j in range(1, 3):
        ctl.keep_drafting_batch([[0.5] * j])
    ctl.observe_batch([[0.5, 0.5]], accepted=[2], submitted=2, draft_step_s=0.01, verify_s=0.1, round_s=0.15)
    assert ctl.c_select == pytest.approx(0.15 - 2 * 0.01 - 0.1)
    probs = [0.7] * 16
    ks = [choose_k(probs, range(1, 17), 0.05, lambda k: 0.1 + 0.002 * k, c_select=c_s) for c_s in (0.0, 0.05, 0.2, 1.0)]
    assert ks == sorted(ks) and ks[-1] > ks[0]


def test_warmup_cycles_and_centres_update():
    ctl = EntropyController(warmup_k=(4, 8), warmup_rounds=2, fallback=False)
    assert run_online(ctl, [0.1] * 16) == (4, 4)
    ctl.observe_batch([[0.1, 0.2, 0.3, 2.0]], accepted=[3], submitted=4, draft_step_s=0.01, verify_s=0.05)
    assert run_online(ctl, [0.1] * 16) == (8, 8)
    assert ctl.mu_acc is not None and ctl.mu_rej == pytest.approx(2.0)
    # mu_acc: EMA over 0.1, 0.2, 0.3 with rate 0.1, starting from the first value
    assert ctl.mu_acc == pytest.approx(0.9 * (0.9 * 0.1 + 0.1 * 0.2) + 0.1 * 0.3)


def test_without_a_profile_a_generation_opens_with_an_ar_step_then_warms_up_small_first():
    ctl = EntropyController()
    assert ctl.start_round(limit=100) == 0 and ctl.trace()["choice"] == "ar_probe"
    ctl.observe_batch([[]], accepted=[0], submitted=0, draft_step_s=None, verify_s=0.1, round_s=0.1)
    assert ctl.plain.cost_ar() == 0.1
    ks = []
    for _ in range(3):                                   # cheap rounds: 0.12 s for up to 3 tokens
        ks.append(ctl.start_round(limit=100))
        ctl.keep_drafting_batch([[0.5] * ks[-1]])
        ctl.observe_batch([[0.5] * ks[-1]], accepted=[ks[-1]], submitted=ks[-1], draft_step_s=0.01, verify_s=0.1,
                          round_s=0.12)
    assert ks == [2, 4, 8]                               # the warm-up grows from its smallest k
    assert not ctl.plain.falling_back


def test_a_warmup_round_dearer_than_its_expected_tokens_hands_over_to_the_fallback_at_once():
    """A loaded machine: the first warm-up round costs 13 AR steps for at most 3 tokens."""
    ctl = EntropyController()
    ctl.start_round(limit=100)
    ctl.observe_batch([[]], accepted=[0], submitted=0, draft_step_s=None, verify_s=0.27, round_s=0.27)
    k = ctl.start_round(limit=100)
    ctl.keep_drafting_batch([[0.5] * k])
    ctl.observe_batch([[0.5] * k], accepted=[0], submitted=k, draft_step_s=0.5, verify_s=2.6, round_s=3.6)
    assert ctl.plain.falling_back
    assert ctl.start_round(limit=100) == 0 and ctl.trace()["choice"] == "fallback"   # not three more warm-up rounds


def test_after_a_warmup_lost_at_its_first_draft_the_probe_drafts_the_optimistic_k_not_the_rules_k1():
    """A 4K prompt without a profile: the k = 2 warm-up round (0.27 s, 3 AR steps) is rejected at its first
    draft and hands over: even at the optimistic rate u = 0.68 (Beta(1, 2)'s 90% quantile) no k reaches
    0.95 / C_AR. The rule, fed one rejection (rate 1/3), would draft one token; the probe drafts the k
    with the largest R at u: C_s = 0.27 - 2 x 0.04 - 0.15 = 0.04, C_v flat at 0.15, so
    R(k) = (1 + u + ... + u^k) / (0.19 + 0.04 k): R(1) 7.3, R(2) 7.97, R(3) 7.98, R(4) 7.7."""
    ctl = EntropyController(prior_k=4, probe_every=8)
    ctl.start_round(limit=100)
    ctl.observe_batch([[]], accepted=[0], submitted=0, draft_step_s=None, verify_s=0.09, round_s=0.09)
    assert ctl.start_round(limit=100) == 2
    assert [ctl.keep_drafting_batch([[2.0] * j]) for j in (1, 2)] == [True, False]
    ctl.observe_batch([[2.0, 2.0]], accepted=[0], submitted=2, draft_step_s=0.04, verify_s=0.15, round_s=0.27)
    assert ctl.plain.falling_back and ctl.ready
    assert ctl.optimistic_rate() == pytest.approx(1 - 0.1 ** 0.5)      # Beta(1, 2): 1 - (1 - x)^2 = 0.9
    for _ in range(8):
        assert ctl.start_round(limit=100) == 0 and ctl.trace()["choice"] == "fallback"
        ctl.observe_batch([[]], accepted=[0], submitted=0, draft_step_s=None, verify_s=0.09, round_s=0.09)
    assert ctl.start_round(limit=100) == 3 and ctl.trace()["choice"] == "probe"
    assert [ctl.keep_drafting_batch([[2.0] * j]) for j in (1, 2, 3)] == [True, True, False]
    assert ctl.submit_count(3) == 3                            # the rule's stopping does not cut the probe


def test_a_warmup_round_that_could_pay_at_a_plausible_rate_goes_on_though_its_own_k_lost():
    """4 drafts, 3 accepted, in 0.40 s beside 0.09 s AR steps: judged at Laplace's 4/6 and at its own k, the
    round's expected 2.6 tokens (0.24 s of AR) lost to its 0.40 s. With C_s = 0.40 - 4 x 0.02 - 0.15 = 0.17
    and C_v flat, at u = Beta(4, 2)'s 90% quantile (0.89) k = 11 reaches R = 12.5/s > 0.95 / 0.09 = 10.6/s:
    the warm-up goes on (the fallback's window decides later). With the first draft rejected (one judged
    rejection: Beta(1, 2), u = 0.68) R peaks at k = 5, 6.8/s: it hands over."""
    def first_round(accepted):
        ctl = EntropyController(warmup_k=(4, 8, 2))
        ctl.start_round(limit=100)
        ctl.observe_batch([[]], accepted=[0], submitted=0, draft_step_s=None, verify_s=0.09, round_s=0.09)
        assert ctl.start_round(limit=100) == 4
        assert [ctl.keep_drafting_batch([[1.0] * j]) for j in (1, 2, 3, 4)] == [True, True, True, False]
        ctl.observe_batch([[1.0] * 4], accepted=[accepted], submitted=4, draft_step_s=0.02, verify_s=0.15,
                          round_s=0.40)
        assert ctl.c_select == pytest.approx(0.17)
        return ctl
    going_on = first_round(3)
    assert not going_on.plain.falling_back and going_on.optimistic_rate() == pytest.approx(0.888, abs=1e-3)
    assert going_on.best_optimistic(16) == (11, pytest.approx(12.55, abs=0.01))
    assert going_on.start_round(limit=100) == 8                       # the next warm-up round
    handed_over = first_round(0)
    assert handed_over.plain.falling_back and handed_over.best_optimistic(16)[0] == 5


def test_a_cost_profile_with_c_ar_opens_speculating_without_an_ar_probe():
    ctl = EntropyController()
    ctl.use_cost_prior(CostProfile(draft_step_s=0.01, verify_s={1: 0.1, 2: 0.11}, ar_step_s=0.1))
    assert ctl.start_round(limit=100) > 0


def test_fixed_k_caps_at_the_limit():
    assert run_online(FixedK(8), [0.0] * 16, limit=3) == (3, 3)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_entropy_controller_traces_are_consistent(arch):
    model = build_tiny(arch)
    prompt = random_prompt(200)
    gen = sparsespec.generate(model, prompt, method="sparsespec", controller="entropy", recent=16, budget=60,
                              warmup_rounds=2, max_new_tokens=60, stop_at_eos=False,
                              fallback=False)   # the rule in charge: a random model's drafts lose to AR
    assert 1 + sum(r.emitted for r in gen.rounds) == len(gen.tokens) == 60
    assert all(r.emitted == r.accepted + 1 for r in gen.rounds[:-1])
    traced = [r for r in gen.rounds if r.accept_probs]
    assert traced, "after warm-up the controller's beliefs are traced"
    for r in traced:
        assert len(r.accept_probs) == len(r.survival) == len(r.entropies) == r.drafted
        assert r.survival == pytest.approx(survival(r.accept_probs))
        assert r.cost_draft > 0 and r.cost_verify > 0
        assert r.draft_steps in (r.drafted, r.drafted + 1)   # at most one drafted token discarded


def test_cycle_controller_drafts_each_k_in_turn():
    ctl = CycleK(ks=(1, 4, 2))
    drafted = []
    for _ in range(6):
        drafted.append(run_online(ctl, [0.0] * 16)[0])
        ctl.observe_batch([[]], accepted=[0], submitted=drafted[-1], draft_step_s=0.01, verify_s=0.1)
    assert drafted == [1, 4, 2, 1, 4, 2] and ctl.max_k == 4


def test_a_cost_prior_puts_the_rule_in_charge_from_round_one_and_its_slope_decides_k():
    """With a measured profile the warm-up is skipped; a steep C_v(k) means a shorter k than a flat one."""
    entropies = [0.3] * 16

    def k_chosen(verify_s):
        ctl = EntropyController(warmup_rounds=4, fallback=False)
        ctl.use_cost_prior(CostProfile(draft_step_s=0.02, verify_s=verify_s))
        ctl.mu_acc, ctl.mu_rej, ctl.n_accepted, ctl.n_rejected = 0.3, 3.0, 50, 5
        assert ctl.ready
        return run_online(ctl, entropies)[1]

    flat = k_chosen({1: 0.10, 16: 0.10})
    steep = k_chosen({1: 0.10, 16: 0.10 + 15 * 0.05})
    assert steep < flat


def test_one_slow_round_cannot_make_the_verify_line_predict_a_free_verification():
    """The B=8 failure: warm-up timed k=4 at 0.7 s and k=8 at 2.3 s (one slow round); the line
    through them predicted C_v(1) = -0.45 s, so k=1 won every round. The line now stays above 0."""
    from sparsespec.controllers.cost_models import LinearCostModel
    line = LinearCostModel()
    line.add(4, 0.7)
    line.add(8, 2.3)
    assert [round(line(k), 6) for k in (1, 4, 8)] == [round(k * (4 * 0.7 + 8 * 2.3) / 80, 6) for k in (1, 4, 8)]
    assert all(line(k) > 0 for k in range(1, 17))
    assert all(line(k + 1) >= line(k) for k in range(1, 16))
    fine = LinearCostModel()                                  # an ordinary line keeps its intercept
    fine.add(1, 0.10)
    fine.add(9, 0.18)
    assert fine.line() == pytest.approx((0.09, 0.01))


@pytest.mark.parametrize("fit", ["line", "hull"])
def test_a_point_unmeasured_for_its_age_leaves_the_fit_or_returns_to_its_profile_value(fit):
    from sparsespec.controllers.cost_models import HullCostModel, LinearCostModel
    model = (HullCostModel if fit == "hull" else LinearCostModel)(max_age=3)
    model.seed(8, 0.30)                             # a cost profile's C_v(8)
    model.tick()
    model.add(2, 0.13)                              # measured in round 1 (a cold round at another count)
    model.add(8, 0.50)                              # ... and k = 8 once, under a load since gone
    for _ in range(3):                              # rounds 2-4: only k = 1 measured
        model.tick()
        model.add(1, 0.09)
    assert model.points() == pytest.approx({1: 0.09, 2: 0.13, 8: 0.30 * 0.8 + 0.50 * 0.2})   # age 3: kept
    model.tick()
    model.add(1, 0.09)
    assert model.points() == pytest.approx({1: 0.09, 8: 0.30})   # age 4: k = 2 leaves, k = 8 is the profile's
    lone = (HullCostModel if fit == "hull" else LinearCostModel)(max_age=3)
    lone.add(2, 0.13)
    lone.add(1, 0.09)
    for _ in range(5):
        lone.tick()
    assert lone.points() == {1: 0.09} and lone(1) == lone(6) == pytest.approx(0.09)   # none fresh: the last, flat
    keep = (HullCostModel if fit == "hull" else LinearCostModel)(max_age=None)
    keep.add(2, 0.13)
    for _ in range(50):
        keep.tick()
    assert keep.points() == {2: 0.13}


def test_a_first_measurement_is_replaced_by_the_second_and_a_stale_point_restarts():
    """A k's first round runs cold: the second measurement replaces it; the EMA runs from there on,
    and a point measured again after going stale starts over from the new measurement."""
    from sparsespec.controllers.cost_models import LinearCostModel
    model = LinearCostModel(ema=0.2, max_age=3)
    model.add(2, 0.13)
    model.add(2, 0.10)
    assert model.by_k[2] == pytest.approx(0.10)
    model.add(2, 0.20)
    assert model.by_k[2] == pytest.approx(0.8 * 0.10 + 0.2 * 0.20)
    for _ in range(4):
        model.tick()
    model.add(2, 0.30)
    assert model.by_k[2] == pytest.approx(0.30)
    model.add(2, 0.25)                              # started over: its second measurement replaces it
    assert model.by_k[2] == pytest.approx(0.25)
    seeded = LinearCostModel(ema=0.2, max_age=3)
    seeded.seed(4, 0.50)
    for _ in range(10):
        seeded.tick()
    assert seeded.points() == {4: 0.50}             # a profile point never measured does not age
    seeded.add(4, 0.40)
    assert seeded.by_k[4] == pytest.approx(0.8 * 0.50 + 0.2 * 0.40)
    seeded.add(4, 0.30)                             # the second restarts from the profile's value
    assert seeded.by_k[4] == pytest.approx(0.8 * 0.50 + 0.2 * 0.30)


def test_a_cost_profile_seeds_the_verify_points_that_stale_measurements_return_to():
    ctl = EntropyController(warmup_rounds=0, fallback=False, verify_point_age=2)
    ctl.use_cost_prior(CostProfile(draft_step_s=0.02, verify_s={1: 0.10, 8: 0.30}))
    assert ctl.c_verify.prior == {1: 0.10, 8: 0.30}
    ctl.observe_batch([[0.3] * 8], [8], 8, 0.02, 0.60)
    assert ctl.c_verify.points()[8] == pytest.approx(0.8 * 0.30 + 0.2 * 0.60)
    for _ in range(3):
        ctl.observe_batch([[]], [0], 0, None, 0.05)  # AR rounds age every point
    assert ctl.c_verify.points() == {1: 0.10, 8: 0.30}


def test_a_slow_first_round_at_k_2_does_not_hold_the_rule_at_k_1_for_good():
    """The library at 4K: the warm-up's k = 2 round, cold and at one thread, verified in 130 ms;
    the k = 1 rounds after it, at two threads, in 91. The line through both (39 ms a token) made
    every k > 1 look too dear, and the rule drafted k = 1 to the end of the generation, though its
    drafts were all accepted. Once the k = 2 point is older than `verify_point_age` rounds, it
    leaves the fit and the rule drafts further."""
    ctl = EntropyController(warmup_rounds=0, fallback=False, verify_point_age=16)
    ctl.c_draft, ctl.c_select = 0.032, 0.007
    ctl.c_verify.add(2, 0.130)
    ks = []
    for _ in range(30):
        drafted, k = run_online(ctl, [0.3] * 16)
        ks.append(k)
        ctl.observe_batch([[0.3] * k], [k], k, 0.032, 0.091 + 0.010 * (k - 1), round_s=0.007 + 0.032 * k + 0.091)
    assert ks[0] == 1                               # the stale slope holds k at 1 while the point is fresh
    assert max(ks[17:]) > 1                         # then it is gone, and k grows
    frozen = EntropyController(warmup_rounds=0, fallback=False, verify_point_age=10 ** 6)
    frozen.c_draft, frozen.c_select = 0.032, 0.007
    frozen.c_verify.add(2, 0.130)
    for _ in range(30):
        drafted, k = run_online(frozen, [0.3] * 16)
        assert k == 1                               # the old behaviour: k = 1 for good
        frozen.observe_batch([[0.3] * k], [k], k, 0.032, 0.091, round_s=0.007 + 0.032 * k + 0.091)


def test_the_hull_fit_is_exact_where_a_line_through_convex_costs_makes_small_k_too_cheap():
    """SmolLM2 8K, B = 8: verification costs rise faster than linearly in k, the line through
    k = 1..16 predicted C_v(1) well under its measured value, and the controller sat at k = 1."""
    from sparsespec.controllers.cost_models import HullCostModel, LinearCostModel
    measured = {1: 0.44, 2: 0.50, 4: 0.63, 8: 0.95, 12: 1.35, 16: 1.90}          # convex in k
    line, hull = LinearCostModel(), HullCostModel()
    for k, seconds in measured.items():
        line.add(k, seconds)
        hull.add(k, seconds)
    assert line(1) < 0.9 * measured[1]
    assert all(hull(k) == pytest.approx(v) for k, v in measured.items())
    values = [hull(k) for k in range(1, 21)]
    assert all(b >= a for a, b in zip(values, values[1:]))                          # non-decreasing
    assert all(values[i - 1] + values[i + 1] >= 2 * values[i] - 1e-12 for i in range(1, 19))   # convex
    assert hull(20) == pytest.approx(1.90 + 4 * (1.90 - 1.35) / 4)                  # last slope beyond
    ctl_line = EntropyController(warmup_rounds=0)
    ctl_hull = EntropyController(warmup_rounds=0, verify_cost_fit="hull")
    probs = [0.9] * 16
    k_line = choose_k(probs, range(1, 17), 0.045, line)
    k_hull = choose_k(probs, range(1, 17), 0.045, hull)
    assert k_line != k_hull                         # the fit changes the choice on these costs
    assert isinstance(ctl_hull.c_verify, HullCostModel) and type(ctl_line.c_verify) is LinearCostModel


def test_the_hull_drops_a_point_above_it_and_stays_flat_left_of_the_first():
    from sparsespec.controllers.cost_models import HullCostModel
    hull = HullCostModel()
    for k, seconds in {2: 0.40, 3: 0.60, 5: 0.65, 6: 0.30 + 0.65}.items():   # k=3 lies above the chord 2-5
        hull.add(k, seconds)
    assert hull(3) == pytest.approx(0.40 + 0.25 / 3)
    assert hull(1) == pytest.approx(0.40) and hull(2) == pytest.approx(0.40)
    dipping = HullCostModel()
    dipping.add(1, 0.5)
    dipping.add(2, 0.3)                                 # noise: cheaper at 2 than at 1
    dipping.add(4, 0.6)
    assert [dipping(k) for k in (1, 2, 3)] == pytest.approx([0.5, 0.5, 0.5])   # never below C_v at the first k
    assert dipping(4) == pytest.approx(0.6)


def test_a_batch_cost_profile_times_batched_rounds_and_pools_their_acceptance():
    model = build_tiny("llama")
    prompts = [random_prompt(120, seed=1)[0], random_prompt(150, seed=2)[0]]
    options = dict(recent=16, budget=60)
    batched = measure_cost_profile(model, prompts, method="sparsespec", ks=(1, 4), repeats=2, **options)
    assert set(batched.verify_s) >= {1, 4} and batched.draft_step_s > 0
    assert batched.acceptance_rate is not None and sum(batched.bins.judged) > 0
    gens = sparsespec.generate(model, prompts, method="sparsespec", max_new_tokens=24, stop_at_eos=False,
                               cost_prior=batched, **options)
    for prompt, gen in zip(prompts, gens):
        alone = sparsespec.generate(model, prompt[None], method="ar", max_new_tokens=24, stop_at_eos=False)
        assert gen.tokens == alone.tokens
    assert any(r.accept_probs for r in gens[0].rounds[:2]), "with a prior the rule decides from the first rounds"


@pytest.mark.parametrize("fit", ["line", "hull"])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_cost_profile_measures_every_k_and_a_run_from_it_stays_lossless(arch, fit):
    model = build_tiny(arch)
    prompt = random_prompt(200)
    profile = measure_cost_profile(model, prompt, method="sparsespec", ks=(1, 2, 4), repeats=2,
                                   recent=16, budget=60, candidates=(1, 2))   # controller options are ignored
    assert {1, 2, 4} <= set(profile.verify_s) and profile.draft_step_s > 0   # a capped last round adds its own k
    assert all(s > 0 for s in profile.verify_s.values())
    ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=40, stop_at_eos=False)
    gen = sparsespec.generate(model, prompt, method="sparsespec", recent=16, budget=60, max_new_tokens=40,
                              stop_at_eos=False, cost_prior=profile, verify_cost_fit=fit)
    assert gen.tokens == ar.tokens
    assert any(r.accept_probs for r in gen.rounds[:2]), "with a prior the rule decides from the first rounds"


def test_profile_of_reads_the_acceptance_evidence_of_its_rounds():
    from sparsespec.calibration import profile_of
    from sparsespec.engine.generation import Round
    rounds = [Round(drafted=3, accepted=1, emitted=2, entropies=[0.2, 2.0, 0.1], draft_s=0.03, verify_s=0.1,
                    draft_steps=3),
              Round(drafted=2, accepted=2, emitted=3, entropies=[0.4, 0.6], draft_s=0.02, verify_s=0.09,
                    draft_steps=2)]
    profile = profile_of(rounds)
    assert profile.accepted_entropy == pytest.approx((0.2 + 0.4 + 0.6) / 3)
    assert profile.rejected_entropy == pytest.approx(2.0)          # the first rejected draft only
    assert profile.acceptance_rate == pytest.approx(3 / 4)          # 3 accepted of 4 judged


def test_a_batch_profile_keeps_only_the_rounds_the_whole_batch_took_part_in():
    """A sequence that finishes leaves the batch; the rounds after it verify fewer rows and must not
    set C_v(k) (one such k = 5 round made the hull flat over k = 1..5 at Qwen 16K, B = 8)."""
    from sparsespec.calibration import full_batch_rounds, profile_of
    from sparsespec.engine.generation import Generation, Round

    def round_(k, seconds):
        return Round(drafted=k, accepted=k, emitted=k + 1, entropies=[0.1] * k, draft_s=0.01 * k,
                     verify_s=seconds, draft_steps=k)
    together = [round_(1, 0.9), round_(4, 2.5)]
    short = Generation(tokens=[], prefill_s=0, decode_s=0, rounds=together)
    long = Generation(tokens=[], prefill_s=0, decode_s=0, rounds=together + [round_(5, 0.46), round_(1, 0.3)])
    rounds = full_batch_rounds([long, short])
    assert len(rounds) == 4 and all(r in together for r in rounds)
    assert profile_of(rounds).verify_s == {1: 0.9, 4: 2.5}
    assert profile_of([r for g in (long, short) for r in g.rounds]).verify_s[5] == 0.46   # what it drops


def test_an_acceptance_prior_opens_a_prompt_at_the_k_its_evidence_supports():
    """Without acceptance evidence the rule opens at p = 1/2 (Laplace) and drafts k = 1; seeded by a
    profile that saw 90% of drafts accepted at low entropy, the same costs choose a longer draft."""
    from sparsespec.controllers.acceptance import EntropyBins
    bins = EntropyBins()
    for _ in range(40):
        bins.add(0.3, True)                  # low-entropy drafts: always accepted
    for i in range(10):
        bins.add(3.6, i < 5)                 # high-entropy drafts: half accepted
    profile = CostProfile(draft_step_s=0.02, verify_s={1: 0.10, 16: 0.16}, accepted_entropy=0.3,
                          rejected_entropy=3.0, acceptance_rate=0.9, bins=bins)
    unseeded = EntropyController(prior_strength=0, fallback=False)
    unseeded.use_cost_prior(profile)
    seeded = EntropyController(fallback=False)
    seeded.use_cost_prior(profile)
    assert (seeded.mu_acc, seeded.mu_rej) == (0.3, 3.0) and seeded.n_accepted == pytest.approx(0.9 * 16)
    low = [0.3] * 16
    assert run_online(unseeded, low)[1] == 1
    assert run_online(seeded, low)[1] > 4
    assert seeded.acceptance(0.3) > seeded.acceptance(3.6)     # the bins, not one rate, decide
    assert sum(seeded.bins.judged) == pytest.approx(16)
    seeded.observe_batch([[3.0]], accepted=[0], submitted=1, draft_step_s=0.02, verify_s=0.1)
    assert seeded.n_rejected == pytest.approx(0.1 * 16 + 1)        # online rounds add to the pseudo-counts
    assert sum(seeded.bins.judged) == pytest.approx(17)


def test_binned_acceptance_is_the_measured_rate_of_a_bin_shrunk_towards_the_overall_rate():
    from sparsespec.controllers.acceptance import BIN_SHRINKAGE, EntropyBins
    bins = EntropyBins()
    bins.add_round([0.1, 0.2, 4.0, 0.1], accepted=2, submitted=4)   # 2 accepted, 4.0 rejected, last never judged
    assert sum(bins.judged) == 3 and sum(bins.accepted) == 2
    assert bins.acceptance(0.15, rate=0.5) == pytest.approx((2 + BIN_SHRINKAGE * 0.5) / (2 + BIN_SHRINKAGE))
    assert bins.acceptance(4.2, rate=0.5) == pytest.approx((0 + BIN_SHRINKAGE * 0.5) / (1 + BIN_SHRINKAGE))
    assert bins.acceptance(9.0, rate=0.7) == pytest.approx(0.7)     # an empty (open last) bin: the overall rate
