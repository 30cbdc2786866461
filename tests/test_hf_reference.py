"""transformers' own generate() as reference rows (sparsespec/hf_reference.py): the same tokens as
sparsespec's AR, timed and counted the same way."""
from __future__ import annotations

import pytest

import sparsespec
from conftest import ARCHS, build_tiny, random_prompt
from sparsespec import ConfigError
from sparsespec.engine.eos import through_eos
from sparsespec.hf_reference import hf_generate, rounds_from_stamps

NEW = 24


def repeating_prompt():
    prompt = random_prompt(300)
    prompt[0, 200:260] = prompt[0, 100:160]
    return prompt


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_rows_decode_what_sparsespec_ar_decodes(arch):
    model = build_tiny(arch)
    prompt = repeating_prompt()
    ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=NEW, stop_at_eos=False)
    for method in ("hf_generate", "hf_pld"):
        gen = hf_generate(model, prompt, method=method, max_new_tokens=NEW, stop_at_eos=False)
        assert gen.tokens == ar.tokens, method
        assert gen.prefill_s > 0 and gen.decode_s > 0 and gen.prompt_tokens == 300
        assert sum(r.verify_s for r in gen.rounds) <= gen.decode_s
    plain = hf_generate(model, prompt, max_new_tokens=NEW, stop_at_eos=False)
    assert len(plain.rounds) == NEW - 1 and plain.mean_accepted == 1.0 and plain.acceptance_rate == 0.0


def test_hf_pld_counts_the_candidates_of_each_round():
    model = build_tiny("llama")
    prompt = repeating_prompt()
    prompt[0, 240:300] = prompt[0, 100:160]           # the prompt ends inside a repeat: lookup finds it
    gen = hf_generate(model, prompt, method="hf_pld", max_new_tokens=NEW, stop_at_eos=False)
    assert any(r.drafted > 0 for r in gen.rounds)
    assert all(0 <= r.accepted <= r.drafted and r.emitted >= 1 for r in gen.rounds)
    assert len(gen.tokens) >= 1 + sum(r.emitted for r in gen.rounds)


def test_rounds_come_from_the_step_stamps():
    stamps = [(1.0, 101), (1.5, 102), (1.75, 105)]    # prefill ends at 1.0; then 1 token, then 3
    rounds = rounds_from_stamps(stamps, drafted=[0, 0, 4])
    assert [(r.drafted, r.accepted, r.emitted) for r in rounds] == [(0, 0, 1), (4, 2, 3)]
    assert [r.verify_s for r in rounds] == [0.5, 0.25]


def test_eos_and_options():
    model = build_tiny("llama")
    prompt = random_prompt(100)
    ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=12, stop_at_eos=False)
    model.generation_config.eos_token_id = ar.tokens[4]
    try:
        assert hf_generate(model, prompt, max_new_tokens=12, stop_at_eos=True).tokens == through_eos(ar.tokens, {ar.tokens[4]})
        assert hf_generate(model, prompt, max_new_tokens=12, stop_at_eos=False).tokens == ar.tokens
    finally:
        model.generation_config.eos_token_id = None
    with pytest.raises(ConfigError, match="unknown option"):
        hf_generate(model, prompt, method="hf_generate", max_new_tokens=4, k=3)


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])   # a compile: ~15 s
def test_the_static_row_decodes_what_ar_decodes_and_keeps_its_warm_up_out_of_the_timing(compiled):
    model = build_tiny("qwen2")                           # sliding-window layers: the static cache's masks apply
    prompt = repeating_prompt()
    ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=NEW, stop_at_eos=False)
    gen = hf_generate(model, prompt, method="hf_generate_static", compile=compiled, max_new_tokens=NEW,
                      stop_at_eos=False)
    assert gen.tokens == ar.tokens
    assert gen.options["compile"] is compiled and gen.options["compile_s"] > 0    # the untimed warm-up, reported
    assert gen.prefill_s > 0 and gen.decode_s > 0 and len(gen.rounds) == NEW - 1
