"""The API's contract: bad input gets one clear error; the cache rolls back; metrics add up."""
from __future__ import annotations

import warnings

import pytest
import torch

import sparsespec
from conftest import build_tiny, random_prompt
from sparsespec import ConfigError
from sparsespec.engine.cache import PreallocatedLayer


@pytest.fixture(scope="module")
def model():
    return build_tiny("llama")


@pytest.mark.parametrize("kwargs, words", [
    (dict(method="nope"), ["unknown method 'nope'", "sparsespec"]),
    (dict(method="sparsespec", sink=0, recent=0, topk=0), ["sink=0 recent=0 topk=0", "no position"]),
    (dict(method="sparsespec", topk=-1), ["topk=-1"]),
    (dict(method="sparsespec", sink=2.5), ["sink=2.5"]),
    (dict(method="sparsespec", bogus=1), ["unknown option", "bogus", "accepted"]),
    (dict(method="sparsespec", controller="magic"), ["controller 'magic'"]),
    (dict(method="pld", controller="entropy"), ["does not fit method 'pld'"]),
    (dict(method="sparsespec", controller="fixed", k=0), ["k=0"]),
    (dict(method="sparsespec", controller="fixed", tau=2.0), ["do not apply", "fixed"]),
    (dict(method="ar", max_new_tokens=0), ["max_new_tokens=0"]),
    (dict(method="layerskip", exit_layer=9), ["exit_layer=9"]),
    (dict(method="assisted"), ["draft_model is required"]),
    (dict(method="ar", temperature=float("inf")), ["temperature=inf"]),
    (dict(method="sparsespec", budget=-0.1), ["budget=-0.1", "> 0"]),
    (dict(method="pld", max_ngram=0), ["max_ngram=0", ">= 1"]),
    (dict(method="layerskip", exit_layer=0), ["exit_layer=0", ">= 1"]),
    (dict(method="sparsespec", lookahead="maybe"), ["lookahead='maybe'", "predict"]),
    (dict(method="ar", temperature=-1.0), ["temperature=-1.0"]),
    (dict(method="ar", temperature=0.5, seed="abc"), ["seed='abc'", "integer"]),
    (dict(method="ar", seed=1.5), ["seed=1.5", "integer"]),
])
def test_bad_input_raises_one_line_config_error(model, kwargs, words):
    kwargs.setdefault("max_new_tokens", 4)
    with pytest.raises(ConfigError) as err:
        sparsespec.generate(model, random_prompt(200), **kwargs)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_a_prompt_past_the_models_positions_warns_once_per_model():
    """max_position_embeddings=64: a 60-token prompt plus 8 new tokens runs past it; the second
    call on the same model says nothing more, a prompt that fits says nothing at all."""
    from sparsespec.call_checks import PastPositionsWarning

    short = build_tiny("llama", max_position_embeddings=64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sparsespec.generate(short, random_prompt(40), method="ar", max_new_tokens=8)
        assert not caught
        sparsespec.generate(short, random_prompt(60), method="ar", max_new_tokens=8)
        sparsespec.generate(short, [random_prompt(60)[0]] * 2, method="ar", max_new_tokens=8)
    messages = [str(w.message) for w in caught if issubclass(w.category, PastPositionsWarning)]
    assert len(messages) == 1
    assert "60 tokens" in messages[0] and "max_position_embeddings=64" in messages[0]


def test_batch_of_prompts_is_decoded_batched(model):
    """A (2, L) batch runs through sparsespec/engine/loop.py (tests/test_batch.py): one Generation per row."""
    gens = sparsespec.generate(model, torch.ones(2, 10, dtype=torch.long), method="ar", max_new_tokens=3)
    assert len(gens) == 2 and all(len(g.tokens) == 3 for g in gens)


@pytest.mark.parametrize("ids, words", [
    (torch.tensor([[1, 2, 128]]), ["token id 128", "vocabulary of 128", "0 to 127"]),
    ([5, -1, 7], ["token id -1", "vocabulary of 128"]),
    (torch.tensor([[1.0, 2.0]]), ["integer token ids", "torch.float32"]),
    (torch.tensor([True, False]), ["integer token ids", "torch.bool"]),
], ids=["past-vocab", "negative", "float", "bool"])
def test_prompt_ids_must_be_integers_inside_the_vocabulary(model, ids, words):
    with pytest.raises(ConfigError) as err:
        sparsespec.generate(model, ids, method="ar", max_new_tokens=2)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_attention_implementation_is_restored(model):
    before = model.config._attn_implementation
    sparsespec.generate(model, random_prompt(50), method="sparsespec", max_new_tokens=5, recent=4, budget=10)
    assert model.config._attn_implementation == before


def test_preallocated_layer_rolls_back_in_place():
    layer = PreallocatedLayer(capacity=8)
    k = torch.arange(12, dtype=torch.float32).view(1, 1, 6, 2)
    keys, _ = layer.update(k, -k)
    buffer = layer.keys
    layer.crop(-2)
    assert layer.get_seq_length() == 4
    keys, values = layer.update(k[:, :, :1] + 100, k[:, :, :1])
    assert layer.keys is buffer                                        # no reallocation, no copy
    assert keys.shape[2] == 5 and torch.equal(keys[0, 0, 4], torch.tensor([100.0, 101.0]))
    with pytest.raises(ValueError):
        layer.crop(3)
    with pytest.raises(RuntimeError, match="overflow"):
        layer.update(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2))


def test_generation_metrics(model):
    gen = sparsespec.generate(model, random_prompt(200), method="sparsespec", controller="fixed", k=4,
                              budget=10_000, draft_weights="full", max_new_tokens=21, stop_at_eos=False)
    assert gen.mean_accepted == pytest.approx(20 / len(gen.rounds)) and gen.mean_accepted > 4
    assert gen.acceptance_rate == 1.0
    assert gen.tokens_per_s == pytest.approx(20 / gen.decode_s)
    split = gen.time_split()
    assert split["draft"] > 0 and split["verify"] > 0 and split["select"] > 0
    assert sum(v for k, v in split.items() if k != "prefill") == pytest.approx(gen.decode_s, rel=1e-6)
    d = gen.to_dict()
    assert d["rounds"][0]["drafted"] == 4 and d["mean_accepted"] == gen.mean_accepted
