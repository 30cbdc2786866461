"""Draft-only weights: the int8 / bf16 copies are separate modules over the target's tensors, and
greedy output stays AR's whatever the draft runs on."""
from __future__ import annotations

import pytest
import torch

import sparsespec
from conftest import build_tiny, random_prompt
from sparsespec.engine.draft_weights import draft_model, resolve_draft_weights
from sparsespec.errors import ConfigError


def test_auto_is_int8_for_an_fp32_cpu_model_and_full_for_bf16():
    model = build_tiny("llama")
    assert resolve_draft_weights(model, "auto") == "int8"
    assert resolve_draft_weights(build_tiny("llama").to(torch.bfloat16), "auto") == "full"
    with pytest.raises(ConfigError, match="draft_weights='int4' is unknown"):
        resolve_draft_weights(model, "int4")


def test_int8_copy_shares_embeddings_and_leaves_the_target_alone():
    model = build_tiny("qwen2")
    before = model.model.layers[0].mlp.up_proj.weight.clone()
    draft = draft_model(model, "int8")
    assert draft is not model and draft_model(model, "int8") is draft          # built once, then cached
    assert draft.model.embed_tokens.weight is model.model.embed_tokens.weight   # shared, not copied
    assert type(model.model.layers[0].mlp.up_proj) is torch.nn.Linear           # target keeps fp32 Linear
    assert type(draft.model.layers[0].mlp.up_proj) is not torch.nn.Linear       # draft's is int8
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight, before)
    assert draft_model(model, "full") is model


@pytest.mark.parametrize("weights", ["int8", "bfloat16"])
@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_greedy_output_is_ar_with_low_precision_drafts(arch, weights):
    model = build_tiny(arch)
    prompt = random_prompt(200)
    ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=40, stop_at_eos=False)
    cases = {"sparsespec": dict(recent=16, budget=40), "layerskip": {}}
    for method in ("sparsespec", "layerskip") if weights == "int8" else ("sparsespec",):
        gen = sparsespec.generate(model, prompt, method=method, draft_weights=weights, max_new_tokens=40,
                                  stop_at_eos=False, **cases[method])
        assert gen.tokens == ar.tokens
        assert gen.options["draft_weights"] == weights


def test_layerskip_refuses_bf16_drafts():
    with pytest.raises(ConfigError, match="draft_weights='bfloat16' must be one of"):
        sparsespec.generate(build_tiny("llama"), random_prompt(50), method="layerskip", draft_weights="bfloat16",
                            max_new_tokens=4)
