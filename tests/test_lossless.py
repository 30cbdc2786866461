"""Greedy output of every method is token-identical to plain decoding (fp32), on Llama, Mistral
with a sliding window and Qwen2 with mixed layers, over budgets from tiny to larger than the context."""
from __future__ import annotations

import pytest
import torch

import sparsespec
from conftest import ARCHS, build_tiny, random_prompt

NEW = 48
PROMPT_LEN = 300          # well above every sparse budget below, and above the 64-token sliding window

TINY_BUDGET = dict(sink=2, recent=4, topk=4)          # 10 of 300 positions: drafts often rejected
MID_BUDGET = dict(sink=4, recent=16, budget=0.2)
OVER_BUDGET = dict(budget=10_000, draft_weights="full")  # more than the context: a dense draft
# every other sparse-KV case drafts with the CPU default, int8 draft weights ("auto")

CASES = {
    "sparsespec-fixed-tiny": ("sparsespec", dict(controller="fixed", k=4, **TINY_BUDGET)),
    "sparsespec-entropy-tiny": ("sparsespec", dict(controller="entropy", **TINY_BUDGET)),
    "sparsespec-fixed-mid": ("sparsespec", dict(controller="fixed", k=6, **MID_BUDGET)),
    "sparsespec-entropy-mid": ("sparsespec", dict(controller="entropy", **MID_BUDGET)),
    "sparsespec-decay-mid": ("sparsespec", dict(controller="fixed", k=3, score_decay=0.5, **MID_BUDGET)),
    "sparsespec-fullweights-mid": ("sparsespec", dict(controller="entropy", draft_weights="full", **MID_BUDGET)),
    "sparsespec-exact-lookahead": ("sparsespec", dict(lookahead="exact", acceptance_prior=False, **TINY_BUDGET)),
    "sparsespec-fixed-over": ("sparsespec", dict(controller="fixed", k=5, **OVER_BUDGET)),
    # fallback off: a dense draft costs about what AR costs, so the timed rule may fall back, and the
    # accepted length checked below would then depend on the clock
    "sparsespec-entropy-over": ("sparsespec", dict(controller="entropy", fallback=False, **OVER_BUDGET)),
    "streaming": ("streaming", dict(k=4, sink=2, budget=24)),
    "snapkv_static": ("snapkv_static", dict(k=4, **MID_BUDGET)),
    "snapkv_static-entropy": ("snapkv_static", dict(controller="entropy", **TINY_BUDGET)),
    "oracle": ("oracle", dict(k=4, **TINY_BUDGET)),
    "h2o-fixed-tiny": ("h2o", dict(controller="fixed", k=4, **TINY_BUDGET)),
    "h2o-entropy-mid": ("h2o", dict(controller="entropy", **MID_BUDGET)),
    "h2o-fixed-over": ("h2o", dict(controller="fixed", k=5, **OVER_BUDGET)),
    "quest-fixed-tiny": ("quest", dict(controller="fixed", k=4, page_size=2, **TINY_BUDGET)),  # 2 pages of 2
    "quest-fixed-mid": ("quest", dict(controller="fixed", k=4, **MID_BUDGET)),   # 16-token pages
    "quest-entropy-mid": ("quest", dict(controller="entropy", page_size=4, **MID_BUDGET)),
    "quest-fixed-over": ("quest", dict(controller="fixed", k=5, **OVER_BUDGET)),
    "layerskip": ("layerskip", dict(k=3, exit_layer=2)),
    "layerskip-entropy": ("layerskip", dict(controller="entropy", exit_layer=3)),
    "assisted-truncated": ("assisted", dict(k=4, draft_model="truncated:2")),
    "assisted-heuristic": ("assisted", dict(controller="heuristic", k=2, draft_model="truncated:1")),
    "pld": ("pld", dict(k=5)),
}


@pytest.fixture(scope="module")
def references():
    """Per architecture: the model, a prompt, sparsespec's AR output and transformers' own greedy output."""
    out = {}
    for arch in ARCHS:
        model = build_tiny(arch)
        prompt = random_prompt(PROMPT_LEN)
        prompt[0, 200:260] = prompt[0, 100:160]          # a repeat, so prompt lookup has something to find
        ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=NEW, stop_at_eos=False)
        hf = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW,
                            do_sample=False, eos_token_id=None, pad_token_id=0)[0, PROMPT_LEN:].tolist()
        out[arch] = (model, prompt, ar, hf)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_ar_matches_transformers_generate(references, arch):
    _, _, ar, hf = references[arch]
    assert ar.tokens == hf
    assert ar.mean_accepted == 1.0 and len(ar.tokens) == NEW


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_is_token_identical_to_ar(references, arch, case):
    model, prompt, ar, hf = references[arch]
    method, options = CASES[case]
    gen = sparsespec.generate(model, prompt, method=method, max_new_tokens=NEW, stop_at_eos=False, **options)
    assert gen.tokens == ar.tokens == hf
    assert 1 + sum(r.emitted for r in gen.rounds) == len(gen.tokens)
    assert all(0 <= r.accepted <= r.drafted for r in gen.rounds)
    if case.endswith("-tiny"):
        # the budget is so small that drafts must be rejected, or the test proves nothing
        assert any(r.accepted < r.drafted for r in gen.rounds)
        assert gen.acceptance_rate < 0.9
    if case.endswith("-over"):
        # a dense draft is the target itself: every draft is accepted
        assert gen.acceptance_rate == 1.0
        assert gen.mean_accepted > 2.0


def test_assisted_with_separate_draft_model(references):
    model, prompt, ar, _ = references["llama"]
    draft = build_tiny("llama", seed=7, num_hidden_layers=1)
    gen = sparsespec.generate(model, prompt, method="assisted", draft_model=draft, k=3,
                              max_new_tokens=NEW, stop_at_eos=False)
    assert gen.tokens == ar.tokens
    assert sum(r.drafted for r in gen.rounds) > 0


def test_prompt_shorter_than_budget_is_dense(references):
    model, prompt, _, _ = references["llama"]
    short = prompt[:, :40]
    ar = sparsespec.generate(model, short, method="ar", max_new_tokens=20, stop_at_eos=False)
    gen = sparsespec.generate(model, short, method="sparsespec", controller="fixed", k=4,
                              sink=4, recent=16, topk=64, draft_weights="full", max_new_tokens=20,
                              stop_at_eos=False)
    assert gen.tokens == ar.tokens
    assert gen.acceptance_rate == 1.0


def test_stops_at_eos_like_transformers():
    model = build_tiny("llama")
    prompt = random_prompt(120, seed=3)
    free = sparsespec.generate(model, prompt, method="ar", max_new_tokens=30, stop_at_eos=False)
    eos = free.tokens[10]                                  # a token the model does produce
    stop = free.tokens.index(eos) + 1
    for method, opts in (("ar", {}), ("sparsespec", dict(controller="fixed", k=4, budget=10_000))):
        gen = sparsespec.generate(model, prompt, method=method, max_new_tokens=30, eos_token_id=eos, **opts)
        assert gen.tokens == free.tokens[:stop]
    hf = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30, do_sample=False,
                        eos_token_id=eos, pad_token_id=0)[0, 120:].tolist()
    assert hf[:stop] == free.tokens[:stop]


@pytest.mark.real_model
def test_real_model_sparsespec_is_lossless_and_accepts_more_than_one(real_model, real_prose_prompt):
    model, _ = real_model
    ar = sparsespec.generate(model, real_prose_prompt, method="ar", max_new_tokens=40, stop_at_eos=False)
    gen = sparsespec.generate(model, real_prose_prompt, method="sparsespec", max_new_tokens=40, stop_at_eos=False)
    assert gen.tokens == ar.tokens
    assert gen.mean_accepted > 1.0
