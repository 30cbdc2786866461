"""Call memory (sparsespec/call_memory.py): a `generate` call starts from what earlier calls on the same
model learned, under the same key only, and decodes the same tokens as plain decoding."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

import sparsespec
from conftest import ARCHS, build_tiny, random_prompt
from sparsespec import call_memory
from sparsespec.controllers.cost_profile import CostProfile, merged
from sparsespec.threads import using

LOW_BUDGET = dict(sink=2, recent=4, topk=2)     # drafts often rejected


def spec(model, prompt, **kwargs):
    options = dict(LOW_BUDGET, **kwargs.pop("options", {}))
    return sparsespec.generate(model, prompt, method="sparsespec", max_new_tokens=kwargs.pop("new", 32),
                               stop_at_eos=False, **{"threads": 1, **kwargs}, **options)


@pytest.mark.parametrize("arch", ARCHS)
def test_calls_that_recall_an_earlier_profile_decode_what_ar_decodes(arch):
    model = build_tiny(arch)
    for seed in (1, 2, 3):
        prompt = random_prompt(300, seed=seed)
        ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=32, stop_at_eos=False, threads=1)
        gen = spec(model, prompt)
        assert gen.options["recalled"] == (seed > 1)
        assert gen.tokens == ar.tokens
    assert any(r.accepted < r.drafted for r in gen.rounds)          # rejections happened in a recalled call


def test_a_second_call_skips_the_measuring_rounds_the_first_ran():
    model = build_tiny("llama")
    first = spec(model, random_prompt(300, seed=1))
    assert first.rounds[0].choice == "ar_probe"                     # a first call measures C_AR, then warms up
    assert any(r.drafted and not r.choice for r in first.rounds)    # warm-up rounds carry no choice
    (learned,) = call_memory.learned(model).values()
    assert learned.profile.ar_step_s > 0 and learned.profile.verify_s
    second = spec(model, random_prompt(300, seed=2))
    assert second.options["recalled"] is True
    assert second.rounds[0].choice == "speculate"                   # no ar_probe, no warm-up
    assert all(r.choice for r in second.rounds[:-1])                # the rule chose every round but the last


def test_only_the_same_key_is_recalled():
    model = build_tiny("mistral")
    spec(model, random_prompt(300, seed=1))
    assert not spec(model, random_prompt(1200, seed=2)).options["recalled"]      # another context
    assert not spec(model, random_prompt(300, seed=3), options=dict(topk=3)).options["recalled"]
    assert not spec(model, random_prompt(300, seed=4), temperature=1.0).options["recalled"]       # sampling
    assert spec(model, random_prompt(290, seed=5)).options["recalled"]          # the same half-octave
    assert len(call_memory.learned(model)) == 4


def test_remember_false_neither_recalls_nor_keeps_and_forget_empties():
    model = build_tiny("qwen2")
    assert not spec(model, random_prompt(300, seed=1), remember=False).options["recalled"]
    assert call_memory.learned(model) == {}
    spec(model, random_prompt(300, seed=1))
    kept = call_memory.learned(model)
    assert not spec(model, random_prompt(300, seed=2), remember=False).options["recalled"]
    assert call_memory.learned(model) == kept
    sparsespec.forget(model)
    assert call_memory.learned(model) == {}
    assert not spec(model, random_prompt(300, seed=3)).options["recalled"]


def test_a_seeded_sampling_call_draws_the_same_whatever_came_before():
    model = build_tiny("qwen2")
    prompt = random_prompt(300, seed=1)
    options = dict(temperature=0.8, top_p=0.9, seed=5, options=dict(fallback=False))
    first = spec(model, prompt, **options)
    for seed in (2, 3):
        spec(model, random_prompt(300, seed=seed), temperature=0.8, top_p=0.9,     # teaches the same key
             options=dict(fallback=False))
    again = spec(model, prompt, **options)
    assert again.options["recalled"] is False and again.tokens == first.tokens
    assert spec(model, prompt, temperature=0.8, top_p=0.9, options=dict(fallback=False)).options["recalled"]


def test_a_given_cost_prior_wins_over_the_memory():
    model = build_tiny("llama")
    spec(model, random_prompt(300, seed=1))
    given = CostProfile(draft_step_s=1e-4, verify_s={1: 1e-3, 2: 1.1e-3}, ar_step_s=1.0)   # AR far dearer
    gen = spec(model, random_prompt(300, seed=2), cost_prior=given)
    assert gen.options["recalled"] is False
    assert gen.rounds[0].cost_ar == pytest.approx(1.0)


def test_the_thread_count_a_call_ended_on_is_where_the_next_starts():
    model = build_tiny("llama")
    with using(2):
        first = spec(model, random_prompt(300, seed=1), threads="auto")
        ended = first.options["threads_final"]
        assert call_memory.learned(model)[next(iter(call_memory.learned(model)))].threads == ended
        second = spec(model, random_prompt(300, seed=2), threads="auto")
        assert {r.threads for r in second.rounds[:16]} == {ended}         # held, not explored
        other = 3 - ended
        given = spec(model, random_prompt(300, seed=3), threads="auto", thread_prior=other)
        assert given.rounds[0].threads == other                           # a caller's prior wins


def test_the_memory_does_not_keep_a_model_alive():
    model = build_tiny("llama")
    spec(model, random_prompt(100, seed=1), new=8)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_remember_must_be_a_bool():
    model = build_tiny("llama")
    with pytest.raises(sparsespec.ConfigError, match=r"remember='yes'; accepted: True .* or False"):
        spec(model, random_prompt(50), remember="yes")


def test_merged_keeps_what_only_the_older_profile_measured():
    older = CostProfile(draft_step_s=1.0, verify_s={2: 2.0, 4: 3.0, 8: 5.0}, ar_step_s=0.5, select_s=0.1,
                        acceptance_rate=0.7, accepted_entropy=0.2, rejected_entropy=1.5)
    one_k = CostProfile(draft_step_s=1.1, verify_s={3: 2.5})
    out = merged(older, one_k)
    assert out.draft_step_s == 1.1 and out.verify_s == {2: 2.0, 3: 2.5, 4: 3.0, 8: 5.0}
    assert (out.ar_step_s, out.select_s, out.acceptance_rate) == (0.5, 0.1, 0.7)
    two_ks = CostProfile(draft_step_s=1.1, verify_s={3: 2.5, 4: 2.9}, ar_step_s=0.6, acceptance_rate=0.9)
    out = merged(older, two_ks)
    assert out.verify_s == {3: 2.5, 4: 2.9}                  # a line's two points: the older ones age out
    assert (out.ar_step_s, out.acceptance_rate, out.accepted_entropy) == (0.6, 0.9, 0.2)
    assert merged(None, one_k) is one_k
