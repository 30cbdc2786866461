"""The online thread rule (sparsespec/engine/thread_rule.py): its decisions on scripted round costs,
`generate`'s `threads` argument, and generations through thread switches, lossless greedy and in
distribution when sampling."""
from __future__ import annotations

import pytest
import torch

import sparsespec
from conftest import ARCHS, build_tiny, random_prompt
from helpers import NEW as SAMPLED, TOLERANCE, enumerate_outputs, model_distribution, total_variation
from sparsespec.api import decode, decode_prompts, sparsespec_attention
from sparsespec.engine.sampling import Sampler
from sparsespec.engine.thread_rule import FixedThreads, OnlineThreads, thread_rule
from sparsespec.errors import ConfigError
from sparsespec.method_options import build_method
from sparsespec.threads import using

COUNTS = (1, 2)


def run_rule(rule, cost, keys) -> list[int]:
    """Drive `rule` over rounds of `keys`; `cost(count, key, i)`: the seconds of round i at `count`.
    Returns the count each round ran at."""
    ran = []
    with using(torch.get_num_threads()):
        for i, key in enumerate(keys):
            count = rule.before_round(key)
            assert torch.get_num_threads() == count
            ran.append(count)
            rule.observe(key, cost(count, key, i))
    return ran


def test_the_faster_count_is_found_in_the_opening_rounds_and_held_with_ever_rarer_reprobes():
    rule = OnlineThreads(COUNTS)
    ran = run_rule(rule, lambda t, key, i: 1.0 if t == 1 else 2.0, [0] * 300)
    assert sorted(ran[:6]) == [1, 1, 1, 2, 2, 2]                     # 3 rounds at each count, then the choice
    assert ran[6:6 + rule.wait_first] == [1] * rule.wait_first       # held for the first wait
    assert rule.current == 1 and rule.reprobes >= 3
    assert ran[6:].count(2) <= 3 * rule.reprobes and ran[100:].count(2) <= 6   # waits double: 16, 32, 64, ...


def test_a_near_tie_keeps_the_current_count():
    rule = OnlineThreads(COUNTS)
    ran = run_rule(rule, lambda t, key, i: 0.99 if t == 1 else 1.0, [0] * 60)   # 1% apart: inside the margin
    assert rule.current == 2 and ran[6:22] == [2] * 16 and rule.wait > rule.wait_first


def settle_after_change(change_at: int, before: dict, after: dict, to: int):
    """Rounds of one key whose seconds per count are `before` until round `change_at`, then `after`:
    (the counts run, how many rounds after the change 10 rounds in a row run at `to`, the rule)."""
    rule = OnlineThreads(COUNTS, wait_max=1000)
    ran = run_rule(rule, lambda t, key, i: (before if i < change_at else after)[t], [0] * 120)
    switched = next(i for i in range(change_at, len(ran)) if ran[i:i + 10] == [to] * 10)
    return ran, switched - change_at, rule


def test_load_that_arrives_mid_generation_is_noticed_before_the_wait_ends():
    quiet_until = 30          # inside the hold that follows the opening choice (of two threads)
    # quiet: two threads faster; loaded: two threads wait for a busy core
    ran, after, rule = settle_after_change(quiet_until, {2: 1.0, 1: 1.5}, {2: 3.0, 1: 1.6}, to=1)
    assert ran[quiet_until - 1] == 2
    assert after <= 2 * rule.rounds + 3, ran         # drift re-probes, long before a doubled wait


def test_one_threads_noisy_rounds_on_a_loaded_core_do_not_reprobe_before_the_wait_ends():
    """Beside a busy core one thread's rounds alternate between fast and slow slices (0.07 / 0.15 s)
    and two threads wait for the busy core (0.25 s): a median of 3 moves by half every few rounds,
    but the choice is never in doubt, so only the doubling wait re-probes."""
    rule = OnlineThreads(COUNTS)
    ran = run_rule(rule, lambda t, key, i: 0.25 if t == 2 else (0.15 if i % 2 == 0 else 0.07), [0] * 70)
    assert rule.current == 1
    assert ran[6:6 + rule.wait_first] == [1] * rule.wait_first
    assert rule.reprobes == 2                       # after the waits of 16 and 32 rounds, no sooner


def test_load_that_leaves_mid_generation_is_noticed_before_the_wait_ends():
    loaded_until = 40         # inside the second hold, after its first 7 rounds have set its baseline
    # loaded: one thread faster; quiet: both faster, two threads the more
    ran, after, rule = settle_after_change(loaded_until, {1: 1.5, 2: 3.0}, {1: 0.9, 2: 0.6}, to=2)
    assert ran[loaded_until - 1] == 1
    assert after <= 4 * rule.rounds, ran            # 7 rounds to see it, 3 + 3 to re-measure


def test_a_new_key_opens_at_one_thread_and_a_reprobe_explores_only_the_chosen_key():
    """A loaded core: an AR step (key 0) costs 1 at one thread and 2 at two; a speculative round
    (key 4) 3 and 30. The first round of a key runs at the fewer threads (a tie), and once key 0
    has chosen, a re-probe explores key 0 alone: no key-4 round ever runs at two threads."""
    keys = [0, 4] + [0] * 10 + [4, 0] * 20
    rule = OnlineThreads(COUNTS)                                     # no prior: two threads to start
    ran = run_rule(rule, lambda t, key, i: (3.0 if key else 1.0) * (10.0 if key and t == 2 else t), keys)
    assert ran[1] == 1 and rule.current == 1 and rule.reprobes >= 1
    assert all(count == 1 for count, key in zip(ran, keys) if key == 4)


def test_a_round_with_drafts_tries_more_threads_only_after_ar_steps_did_no_worse_there():
    """Without a profile a generation opens with an AR step, then warm-up rounds of k = 2, 4, 8, 2. Beside
    a loaded core the second k = 2 round was the first to try two threads, and took 5.1 s (0.38 s at one).
    Rounds with drafts now stay at one thread until AR steps at two were no slower; quiet, once they were,
    a round with drafts tries two threads."""
    loaded = lambda t, key, i: (0.4 if key else 0.1) * (12.0 if key and t == 2 else 2.5 if t == 2 else 1.0)
    keys = [0, 2, 4, 8, 2, 2, 2, 2]
    assert run_rule(OnlineThreads(COUNTS), loaded, keys) == [1] * len(keys)
    rule = OnlineThreads(COUNTS)
    ran = run_rule(rule, loaded, [0] * 6 + [2] * 4)        # AR steps at two threads cost 2.5x: never drafts at two
    assert ran[:6].count(2) == 3 and rule.current == 1 and ran[6:] == [1] * 4
    quiet = lambda t, key, i: (0.4 if key else 0.1) * (0.8 if t == 2 else 1.0)
    ran = run_rule(OnlineThreads(COUNTS), quiet, [0, 0, 2, 2, 2, 2, 2, 2])
    assert ran[:2] == [1, 2] and sorted(ran[2:]) == [1, 1, 1, 2, 2, 2]   # AR steps said two is no slower


def test_when_no_key_is_measured_at_every_count_the_rule_holds_a_count_it_has_evidence_for():
    """A speculating generation's limit changes every round, so no key is measured at both counts: after
    8 x 3 rounds the rule holds. Without a prior or AR steps it holds the fewest threads (rounds with
    drafts never ran at two: no evidence that two is safe); with a prior of two it keeps two."""
    keys = list(range(30, 0, -1))                                    # 30, 29, ...: a new limit every round
    ran = run_rule(OnlineThreads(COUNTS), lambda t, key, i: 0.3, keys)
    assert ran == [1] * len(keys)
    rule = OnlineThreads(COUNTS)
    run_rule(rule, lambda t, key, i: 0.3, keys[:24])
    assert not rule.exploring and rule.current == 1
    rule = OnlineThreads(COUNTS, prior=2)
    rule.explore()                                                   # a re-probe after the prior's hold
    run_rule(rule, lambda t, key, i: 0.3, keys[:24])
    assert not rule.exploring and rule.current == 2


def test_the_ar_methods_rounds_explore_threads_as_ar_steps_whatever_its_controllers_limit():
    """The `ar` method's controller returns a draft limit, but its rounds draft nothing: the rule sees AR
    steps (key 0) and alternates the counts from the first rounds, as it must to choose."""
    model = build_tiny("llama")
    with using(2):
        gen = sparsespec.generate(model, random_prompt(40), method="ar", max_new_tokens=12, threads="auto")
    assert [r.threads for r in gen.rounds[:6]] == [1, 2, 1, 2, 1, 2]


def test_rounds_are_compared_only_with_rounds_of_the_same_draft_limit():
    """Rounds of limit 8 cost ten times rounds of limit 0; one thread is 20% faster at either. The
    exploration pairs rounds by limit, so the mix of limits at each count cannot mislead it."""
    keys = [0, 8, 8, 0, 8, 0, 0, 8, 8, 8, 0, 0, 8, 0] * 10
    rule = OnlineThreads(COUNTS)
    run_rule(rule, lambda t, key, i: (10.0 if key else 1.0) * (0.8 if t == 1 else 1.0), keys)
    assert rule.current == 1


def test_a_prior_opens_holding_its_count():
    rule = OnlineThreads(COUNTS, prior=1)
    ran = run_rule(rule, lambda t, key, i: 1.0, [0] * 16)
    assert ran == [1] * 16 and rule.exploring               # the wait is over: the next round re-probes


@pytest.mark.parametrize("spec, prior, problem", [("fast", None, "threads='fast'"), (0, None, "threads=0"),
                                                  (True, None, "threads=True"), ("auto", 0, "thread_prior=0")])
def test_generate_rejects_a_bad_thread_count_in_one_line(spec, prior, problem):
    model = build_tiny("llama")
    with pytest.raises(ConfigError) as err:
        sparsespec.generate(model, random_prompt(20), method="ar", max_new_tokens=4, threads=spec,
                            thread_prior=prior)
    assert problem in str(err.value) and "accepted" in str(err.value) and "\n" not in str(err.value)


def test_a_fixed_count_runs_every_round_at_it_and_the_callers_count_comes_back():
    model = build_tiny("llama")
    with using(2):
        gen = sparsespec.generate(model, random_prompt(40), method="sparsespec", max_new_tokens=12, threads=1,
                                  sink=2, recent=4, topk=2)
        assert torch.get_num_threads() == 2
    assert {r.threads for r in gen.rounds} == {1} and gen.options["threads"] == 1


def test_auto_where_the_caller_runs_one_thread_runs_no_rule():
    assert isinstance(thread_rule("auto"), OnlineThreads) == (torch.get_num_threads() > 1)
    with using(1):
        assert isinstance(thread_rule("auto"), FixedThreads)


class EveryRound:
    """A thread rule that switches count every round: the most switches a generation can see."""

    def __init__(self):
        self.turn = 0

    def before_round(self, key: int) -> int:
        self.turn += 1
        torch.set_num_threads(COUNTS[self.turn % 2])
        return torch.get_num_threads()

    def observe(self, key: int, seconds: float) -> None:
        pass

    def report(self) -> dict:
        return {"threads": "every round"}


LOW_BUDGET = dict(sink=2, recent=4, topk=2)     # drafts often rejected


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("controller", ["entropy", "fixed"])
def test_greedy_through_a_switch_every_round_is_token_identical_to_ar(arch, controller):
    model = build_tiny(arch)
    prompt = random_prompt(300, seed=3)
    ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=40, stop_at_eos=False, threads=1)
    with torch.inference_mode():
        (gen,) = decode_prompts(model, [prompt], method="sparsespec", max_new_tokens=40,
                                options=dict(LOW_BUDGET, controller=controller),
                                sampler=Sampler(), stop_ids=set(), thread_rule=EveryRound())
    assert gen.tokens == ar.tokens
    assert {r.threads for r in gen.rounds} == set(COUNTS)
    assert any(r.accepted < r.drafted for r in gen.rounds)          # rejections happened


def test_a_batch_through_a_switch_every_round_is_token_identical_to_each_prompt_alone():
    model = build_tiny("mistral")
    prompts = [random_prompt(n, seed=s) for n, s in ((200, 1), (260, 2))]
    alone = [sparsespec.generate(model, p, method="ar", max_new_tokens=24, stop_at_eos=False, threads=1).tokens
             for p in prompts]
    with torch.inference_mode():
        gens = decode_prompts(model, prompts, method="sparsespec", max_new_tokens=24, options=dict(LOW_BUDGET),
                              sampler=Sampler(), stop_ids=set(), thread_rule=EveryRound())
    assert [g.tokens for g in gens] == alone


SAMPLED_OPTIONS = dict(controller="entropy", candidates=(1, 2), prior_k=2, warmup_k=(2,), sink=1, recent=2,
                       topk=2, draft_weights="full")


@pytest.mark.slow   # exact enumeration, ~8 s an architecture
@pytest.mark.parametrize("arch", ARCHS)
def test_sampling_through_a_switch_every_round_and_the_warm_up_hand_over_emits_the_model_distribution(arch):
    """No cost profile: an AR probe, a warm-up round, then the rule's rounds, each at another count;
    the exact distribution of the first tokens is the model's."""
    model = build_tiny(arch, vocab_size=3, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    prompt = random_prompt(16, seed=2, vocab=3)
    choices = []

    @torch.inference_mode()
    def decode_once(sampler) -> tuple:
        drafter, controller, _ = build_method(model, prompt.numel(), "sparsespec", SAMPLED, dict(SAMPLED_OPTIONS))
        with sparsespec_attention(model):
            gen = decode(model, prompt.view(-1), drafter, controller, sampler, SAMPLED, set(), thread_rule=EveryRound())
        choices.append([r.choice for r in gen.rounds])
        return tuple(gen.tokens)

    dist = enumerate_outputs(decode_once)
    with torch.inference_mode():
        exact = model_distribution(model, prompt)
    assert total_variation(dist, exact) < TOLERANCE
    assert all(c[0] == "ar_probe" for c in choices)


def test_the_harness_probe_is_where_the_online_rule_starts(monkeypatch):
    """decode_batch hands each engine row its probe's count as `thread_prior` (online_threads=true),
    or as a fixed count (false), and no call memory: the run's calibration is its evidence."""
    from sparsespec.harness import decoding
    seen = []

    class Called(Exception):
        pass

    def recording_generate(model, ids, **kwargs):
        seen.append((kwargs.get("threads"), kwargs.get("thread_prior"), kwargs.get("remember")))
        raise Called

    class Priors:
        ar_attention = "packed_sdpa"

        def threads_for(self, label, method):
            return 1

        def get(self, label):
            return None

    monkeypatch.setattr(decoding.sparsespec, "generate", recording_generate)
    monkeypatch.setattr(decoding, "prefill", lambda *a, **k: {"sparsespec": object()})
    monkeypatch.setattr(decoding, "measure_profiles", lambda *a, **k: None)
    for online, expected in ((True, ("auto", 1, False)), (False, (1, None, False))):
        config = type("Config", (), dict(batch_size=1, temperature=0.0, top_p=1.0, stop_at_eos=False,
                                         online_threads=online))()
        with pytest.raises(Called):
            decoding.decode_batch(None, [[1, 2, 3]], {"sparsespec": ("sparsespec", {})}, config, 0, 4, Priors())
        assert seen[-1] == expected
