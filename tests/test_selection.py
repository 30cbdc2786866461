"""Which positions the sparse draft sees, and the recorded attention it is chosen from."""
from __future__ import annotations

import torch

import sparsespec
from conftest import build_tiny, random_prompt
from sparsespec.engine.attention import attention_received
from sparsespec.engine.batch_cache import BatchCache, BatchVerifyHook
from sparsespec.api import sparsespec_attention
from sparsespec.engine.selection import (Budget, gather_positions, select_topk_batch, select_topk_positions, sliding_window_of,
                                         window_start)
from sparsespec.methods.sparse_kv import layers_by_window_start


def test_sinks_recent_topk_are_disjoint_and_in_range():
    scores = torch.rand(3, 500)
    budget = Budget(sink=4, recent=16, topk=30)
    pos = select_topk_positions(scores, 400, budget)
    assert pos.shape == (3, 50)
    for head in pos:
        assert len(set(head.tolist())) == 50                         # disjoint
        assert head.min() >= 0 and head.max() < 400                  # in range (scores past 400 ignored)
        assert set(range(4)) <= set(head.tolist())                   # sinks
        assert set(range(384, 400)) <= set(head.tolist())            # recent


def test_topk_follows_scores_per_kv_head():
    scores = torch.zeros(2, 100)
    scores[0, 40:45] = 1.0
    scores[1, 60:65] = 1.0
    pos = select_topk_positions(scores, 100, Budget(sink=2, recent=2, topk=5))
    assert set(pos[0, 2:7].tolist()) == set(range(40, 45))
    assert set(pos[1, 2:7].tolist()) == set(range(60, 65))


def test_short_context_is_a_dense_draft():
    pos = select_topk_positions(torch.rand(2, 30), 30, Budget(4, 16, 64))
    assert torch.equal(pos, torch.arange(30).expand(2, 30))


def test_sliding_window_positions_stay_inside_the_window():
    length, window = 300, 64
    start = window_start(window, length)
    assert start == length - window + 1                              # mask: kv > q - window, q = length
    pos = select_topk_positions(torch.rand(2, 400), length, Budget(4, 8, 20), start)
    assert pos.min() >= start and pos.max() < length
    assert pos.shape[-1] == 32                                       # the sinks' share went to recent
    dense = select_topk_positions(torch.rand(2, 400), length, Budget(40, 40, 40), start)
    assert torch.equal(dense, torch.arange(start, length).expand(2, length - start))


def test_layers_selected_together_pick_what_each_layer_picks_alone():
    """One top-k over (layers, Hkv, C) picks per layer and head the set a top-k of that layer picks,
    for a batch of one, for a batch of different lengths and budgets (padded), and for a dense row."""
    torch.manual_seed(0)
    cases = [([300], [Budget(4, 8, 20)]),
             ([300, 240, 40], [Budget(4, 8, 20), Budget(2, 4, 10), Budget(4, 8, 20)])]   # the last is dense
    for lengths, budgets in cases:
        scores = [torch.rand(5, 2, 320) for _ in lengths]                     # 5 layers, 2 KV heads
        together = select_topk_batch(scores, lengths, budgets, [0] * len(lengths))       # (B, 5, 2, M)
        for layer in range(5):
            alone = select_topk_batch([s[layer] for s in scores], lengths, budgets, [0] * len(lengths))
            assert together.shape[-1] == alone.shape[-1]
            for b in range(len(lengths)):
                for head in range(2):
                    assert sorted(together[b, layer, head].tolist()) == sorted(alone[b, head].tolist())


def test_layers_are_grouped_by_where_their_window_starts():
    assert layers_by_window_start([None] * 4, [300, 200]) == {(0, 0): [0, 1, 2, 3]}
    assert layers_by_window_start([None, None, 64, 64], [300]) == {(0,): [0, 1], (237,): [2, 3]}
    assert layers_by_window_start([64, 64], [30]) == {(0,): [0, 1]}          # the window holds all of it


def test_sliding_window_per_layer_type():
    assert sliding_window_of(build_tiny("llama"), 0) is None
    assert sliding_window_of(build_tiny("mistral"), 0) == 64
    qwen = build_tiny("qwen2")
    assert [sliding_window_of(qwen, i) for i in range(4)] == [None, None, 64, 64]


def test_gather_reads_each_heads_own_positions():
    keys = torch.arange(2 * 10 * 3, dtype=torch.float32).view(1, 2, 10, 3)
    values = -keys
    pos = torch.tensor([[0, 5, 9], [1, 2, 3]])
    k, v = gather_positions(keys, values, pos.unsqueeze(0))
    assert torch.equal(k[0, 0], keys[0, 0, [0, 5, 9]]) and torch.equal(k[0, 1], keys[0, 1, [1, 2, 3]])
    assert torch.equal(v, -k)


def test_recorded_scores_equal_eager_attention_reduced_per_kv_group():
    """Recording in verification gives sum over queries and group heads of eager attention weights."""
    model = build_tiny("llama")
    prompt = random_prompt(50)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        attn = model(prompt, output_attentions=True).attentions         # per layer (1, H, q, N)
    model.set_attn_implementation("sdpa")
    cache = BatchCache(4, 64, [0], torch.device("cpu"))
    for layer in cache.layers:                                          # (1, Hkv, capacity, D), filled by the prompt
        layer.keys, layer.values, layer.is_initialized = torch.zeros(1, 2, 64, 16), torch.zeros(1, 2, 64, 16), True
    recorded = {}
    hook = BatchVerifyHook(cache, [None] * 4, [lambda layer, probs: recorded.__setitem__(layer, attention_received(probs))])
    with torch.no_grad(), sparsespec_attention(model):
        model(prompt[:, :40], past_key_values=cache, use_cache=True)
        cache.set_lengths([40])
        out = model(prompt[:, 40:], past_key_values=cache, use_cache=True, attn_hook=hook).logits
    with torch.no_grad():
        ref = model(prompt).logits[:, 40:]
    assert torch.allclose(out, ref, atol=5e-4)                          # P @ V reproduces attention (fp32)
    for layer, weights in enumerate(attn):
        g = 2                                                           # 4 query heads / 2 KV heads
        expected = weights[0, :, 40:, :].reshape(2, g, 10, 50).sum(dim=(1, 2))
        assert torch.allclose(recorded[layer], expected, atol=1e-5)


def test_one_round_runs_k_draft_forwards_and_one_verify_forward():
    model = build_tiny("llama")
    prompt = random_prompt(200)
    calls = []
    # every forward (prefill, draft, verify) goes through the decoder; full draft weights keep it one module
    handle = model.get_decoder().register_forward_pre_hook(
        lambda mod, args, kwargs: calls.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        gen = sparsespec.generate(model, prompt, method="sparsespec", controller="fixed", k=4, recent=8,
                                  budget=40, draft_weights="full", max_new_tokens=21, stop_at_eos=False)
    finally:
        handle.remove()
    assert calls[0] == 200                                              # prefill (records scores too)
    expected = []
    for r in gen.rounds:                                                # k single-token drafts, then k+1 verified
        assert r.draft_steps == r.drafted
        expected += [1] * r.drafted + [r.drafted + 1]
    assert calls[1:] == expected
    assert [r.drafted for r in gen.rounds[:3]] == [4, 4, 4]             # k = 4 until the output budget ends
