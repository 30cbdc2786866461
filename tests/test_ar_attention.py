"""The AR denominator at its fastest: every way an AR step can attend (`AR_ATTENTION`) decodes what
transformers decodes, the `ar` method and every k = 0 round of a speculative method take the same
path (same code, so the same cost: "k = 0" and AR are one thing), and the default path is
transformers' own q = 1 packing, computed by the same kernel call."""
from __future__ import annotations

import pytest
import torch
from transformers.integrations import sdpa_attention

import sparsespec
from conftest import ARCHS, build_tiny, random_prompt
from sparsespec import ConfigError
from sparsespec.engine import attention, batch_cache
from sparsespec.engine.attention import AR_ATTENTION, DEFAULT_AR_ATTENTION, one_query_attention
from sparsespec.hf_reference import hf_generate

NEW = 20


@pytest.mark.parametrize("arch", ARCHS)
def test_every_ar_path_decodes_what_transformers_decodes(arch):
    model = build_tiny(arch)
    prompt = random_prompt(300)                       # past mistral's tiny sliding window: the window is sliced
    expected = hf_generate(model, prompt, max_new_tokens=NEW, stop_at_eos=False).tokens
    for path in AR_ATTENTION:
        gen = sparsespec.generate(model, prompt, method="ar", max_new_tokens=NEW, stop_at_eos=False, ar_attention=path)
        assert gen.tokens == expected, path
        assert gen.options["ar_attention"] == path


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", AR_ATTENTION)
def test_a_speculative_method_with_k0_rounds_stays_lossless_by_every_path(arch, path):
    model = build_tiny(arch)
    prompt = random_prompt(300)
    ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=NEW, stop_at_eos=False)
    gen = sparsespec.generate(model, prompt, method="sparsespec", controller="cycle", ks=(3, 0, 0), sink=2, recent=8,
                              budget=0.1, max_new_tokens=NEW, stop_at_eos=False, ar_attention=path)
    assert gen.tokens == ar.tokens
    assert any(r.drafted == 0 for r in gen.rounds) and any(r.drafted for r in gen.rounds)


def spy_on_paths(monkeypatch) -> list[str]:
    """The path of every one-query attention call the loop makes, in order."""
    calls = []

    def spied(path, *args, **kwargs):
        calls.append(path)
        return one_query_attention(path, *args, **kwargs)
    monkeypatch.setattr(batch_cache, "one_query_attention", spied)
    return calls


def test_ar_steps_and_k0_rounds_run_the_same_attention_and_drafted_rounds_do_not(monkeypatch):
    model = build_tiny("qwen2")
    layers = model.config.num_hidden_layers
    prompt = random_prompt(200)
    calls = spy_on_paths(monkeypatch)
    ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=6, stop_at_eos=False, ar_attention="sdpa")
    assert calls == ["sdpa"] * layers * len(ar.rounds)            # every AR step, every layer
    calls.clear()
    gen = sparsespec.generate(model, prompt, method="sparsespec", controller="cycle", ks=(2, 0), max_new_tokens=12,
                              stop_at_eos=False, ar_attention="packed_matmul")
    plain = sum(r.drafted == 0 for r in gen.rounds)
    assert plain and calls == ["packed_matmul"] * layers * plain  # k = 0 rounds only: drafted rounds verify explicitly


def test_the_default_path_is_transformers_q1_packing_bit_for_bit(monkeypatch):
    """transformers packs one query per KV group when SDPA's GQA is off: the same SDPA call as ours."""
    model = build_tiny("qwen2")
    module = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(0)
    heads, kv, d = model.config.num_attention_heads, model.config.num_key_value_heads, 16
    query, key, value = (torch.randn(1, heads, 1, d, generator=g), torch.randn(1, kv, 500, d, generator=g),
                         torch.randn(1, kv, 500, d, generator=g))
    monkeypatch.setattr(sdpa_attention, "use_gqa_in_sdpa", lambda *a: False)
    packed, _ = sdpa_attention.sdpa_attention_forward(module, query, key, value, None, scaling=d ** -0.5)
    assert DEFAULT_AR_ATTENTION == "packed_sdpa"
    assert torch.equal(one_query_attention(DEFAULT_AR_ATTENTION, module, query, key, value, d ** -0.5), packed)
    for path in AR_ATTENTION:                                     # the others: the same attention, other kernels
        torch.testing.assert_close(one_query_attention(path, module, query, key, value, d ** -0.5), packed)


def test_an_unknown_path_is_one_clear_error():
    model = build_tiny("llama")
    with pytest.raises(ConfigError, match="ar_attention='fast'.*accepted: packed_sdpa, packed_matmul, sdpa"):
        sparsespec.generate(model, random_prompt(20), method="ar", max_new_tokens=2, ar_attention="fast")
    with pytest.raises(ValueError, match="accepted"):
        attention.one_query_attention("fast", None, None, None, None, 1.0)
