"""The fixed-shape draft step (`static_draft`, `compile_draft`): same drafts as the dynamic draft
cache, greedy output still AR's, and one captured graph for every draft step of a generation."""
from __future__ import annotations

import pytest
import torch

import sparsespec
from conftest import ARCHS, build_tiny, random_prompt, slow_but

BUDGET = dict(sink=2, recent=8, topk=12, draft_weights="full")


@pytest.mark.parametrize("arch", ARCHS)
def test_static_draft_cache_is_lossless(arch):
    model = build_tiny(arch)
    prompt = random_prompt(300)           # above Mistral's 64-token window: the mask must apply it
    ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=40, stop_at_eos=False)
    gen = sparsespec.generate(model, prompt, method="sparsespec", static_draft=True, max_new_tokens=40,
                              stop_at_eos=False, **BUDGET)
    assert gen.tokens == ar.tokens
    assert any(r.accepted < r.drafted for r in gen.rounds)            # drafts are judged, not all accepted
    assert gen.options["static_draft"] is True


def test_static_draft_cache_drafts_what_the_dynamic_one_drafts():
    """Full attention: same positions, same draft tokens; only the layout (masked fixed buffer vs
    gathered slice) differs. (Under a sliding window the static mask also drops positions that
    leave the window while a round drafts, which the dynamic slice keeps, so drafts may differ.)"""
    model = build_tiny("llama")
    prompt = random_prompt(300)
    dynamic, static = [sparsespec.generate(model, prompt, method="sparsespec", controller="fixed", k=4,
                                           static_draft=s, max_new_tokens=40, stop_at_eos=False, **BUDGET)
                       for s in (False, True)]
    assert static.tokens == dynamic.tokens
    assert [r.accepted for r in static.rounds] == [r.accepted for r in dynamic.rounds]
    for a, b in zip(static.rounds, dynamic.rounds):
        assert a.entropies == pytest.approx(b.entropies, abs=1e-4)


@pytest.mark.parametrize("arch", slow_but((), ["llama", "qwen2"]))   # each compile ~3-4 s: `make test`
def test_compiled_draft_step_is_one_graph_and_lossless(arch):
    """Captured by Dynamo (the `eager` backend: tracing without code generation): no recompilation as
    the draft cache fills, and the output is still AR's."""
    torch._dynamo.reset()
    model = build_tiny(arch)
    prompt = random_prompt(200)
    ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=24, stop_at_eos=False)
    compiled = []

    def counting_backend(gm, example_inputs):
        compiled.append(gm)
        return gm.forward

    gen = sparsespec.generate(model, prompt, method="sparsespec", controller="fixed", k=4,
                              compile_draft=counting_backend, max_new_tokens=24, stop_at_eos=False, **BUDGET)
    assert gen.tokens == ar.tokens
    steps = sum(r.draft_steps for r in gen.rounds)
    assert steps >= 10 and 1 <= len(compiled) <= 2, f"{len(compiled)} graphs for {steps} draft steps"


def test_bad_static_options_are_one_line_errors():
    from sparsespec.errors import ConfigError
    model = build_tiny("llama")
    with pytest.raises(ConfigError, match="static_draft='yes' must be true or false"):
        sparsespec.generate(model, random_prompt(100), method="sparsespec", static_draft="yes", recent=8, budget=40,
                            max_new_tokens=4)
