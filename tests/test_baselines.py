"""Baselines: transformers' own implementations as independent references, and the properties each
method should show (prompt lookup finds repeats; the oracle's selection bounds sparsespec's)."""
from __future__ import annotations

import pytest
import torch

import sparsespec
from conftest import build_tiny, random_prompt
from sparsespec.methods.pld import lookup_continuation

REAL_CASES = {
    "sparsespec": {},
    "sparsespec_fixed": dict(controller="fixed", k=4),
    "streaming": dict(k=4),
    "snapkv_static": dict(k=4),
    "oracle": dict(k=4),
    "layerskip": dict(k=3),
    "assisted": dict(k=3, draft_model="truncated:15"),   # no smaller SmolLM2 offline: the first half of it
    "pld": dict(k=5),
}


def hf_greedy(model, prompt, new, **kw):
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, do_sample=False,
                         eos_token_id=None, pad_token_id=0, **kw)
    return out[0, prompt.shape[1]:].tolist()


def test_pld_matches_transformers_prompt_lookup():
    model = build_tiny("llama")
    prompt = random_prompt(200, seed=5)
    prompt[0, 150:190] = prompt[0, 40:80]
    ref = hf_greedy(model, prompt, 40, prompt_lookup_num_tokens=6)
    gen = sparsespec.generate(model, prompt, method="pld", k=6, max_new_tokens=40, stop_at_eos=False)
    assert gen.tokens == ref


def test_assisted_matches_transformers_assisted_generation():
    model = build_tiny("llama")
    draft = build_tiny("llama", seed=3, num_hidden_layers=1)
    prompt = random_prompt(150, seed=6)
    ref = hf_greedy(model, prompt, 40, assistant_model=draft)
    gen = sparsespec.generate(model, prompt, method="assisted", draft_model=draft, k=4,
                              max_new_tokens=40, stop_at_eos=False)
    assert gen.tokens == ref


def test_layerskip_matches_transformers_early_exit():
    model = build_tiny("llama")
    prompt = random_prompt(150, seed=8)
    ref = hf_greedy(model, prompt, 40, assistant_early_exit=2)
    gen = sparsespec.generate(model, prompt, method="layerskip", exit_layer=2, k=4,
                              max_new_tokens=40, stop_at_eos=False)
    assert gen.tokens == ref
    assert model.config.num_hidden_layers == 4            # the early exit was undone


def test_lookup_continuation_finds_latest_match():
    history = torch.tensor([5, 6, 7, 8, 1, 5, 6, 9, 2, 5, 6])
    assert lookup_continuation(history, max_ngram=2, limit=3).tolist() == [9, 2, 5]
    assert lookup_continuation(torch.tensor([1, 2, 3]), max_ngram=2, limit=3).tolist() == []


@pytest.mark.real_model
def test_pld_accepts_more_than_one_token_per_round_on_a_repeating_prompt(real_model, real_prose_prompt):
    model, _ = real_model
    passage = real_prose_prompt[:, :200]
    # the passage twice, then its start again: a copying model continues the passage, which lookup finds
    prompt = torch.cat([passage, passage, passage[:, :20]], dim=1)
    gen = sparsespec.generate(model, prompt, method="pld", k=8, max_new_tokens=40, stop_at_eos=False)
    assert gen.mean_accepted > 1.5


@pytest.mark.real_model
def test_every_method_is_lossless_on_the_real_model(real_model, real_prose_prompt):
    model, _ = real_model
    ar = sparsespec.generate(model, real_prose_prompt, method="ar", max_new_tokens=32, stop_at_eos=False)
    stats = {}
    for name, opts in REAL_CASES.items():
        method = "sparsespec" if name.startswith("sparsespec") else name
        gen = sparsespec.generate(model, real_prose_prompt, method=method, max_new_tokens=32,
                                  stop_at_eos=False, **opts)
        assert gen.tokens == ar.tokens, name
        stats[name] = gen.acceptance_rate
    # at a context far above the budget (1200 tokens, 120-token budget), the oracle bounds sparsespec
    assert stats["oracle"] >= stats["sparsespec_fixed"]
