"""KV-selection policies: the registry finds them, observers see what they should, H2O and Quest
select what the papers select, and the budget rules of #16 (dense instead of refusing)."""
from __future__ import annotations

import pkgutil
from pathlib import Path

import pytest
import torch

import sparsespec
from conftest import build_tiny, random_prompt
from sparsespec.engine.attention import ObservedPrefillHook
from sparsespec.engine.cache import PreallocatedCache
from sparsespec.api import sparsespec_attention
from sparsespec.method_options import resolve
from sparsespec.errors import ConfigError
from sparsespec.methods import METHODS, policies
from sparsespec.engine.selection import select_topk_positions
from sparsespec.engine.proposers import DecodeState
from sparsespec.methods.policies import POLICIES
from sparsespec.methods.policies.quest import QuestPolicy, page_key_bounds, page_upper_bounds
from sparsespec.methods.sparse_kv import SparseKVDrafter
from sparsespec.engine.sampling import Sampler
from sparsespec.engine.selection import Budget

CONF = Path(__file__).resolve().parents[1] / "conf" / "method"
POLICY_METHODS = ("sparsespec", "snapkv_static", "streaming", "oracle", "h2o", "quest")


# --- registry --------------------------------------------------------------------------------------
def test_every_policy_module_registers_one_method_with_a_config():
    modules = {m.name for m in pkgutil.iter_modules(policies.__path__)} - {"base"}
    by_module = {cls.__module__.rsplit(".", 1)[-1]: name for name, cls in POLICIES.items()}
    assert set(by_module) == modules                       # each module holds a registered policy
    assert set(POLICY_METHODS) <= set(POLICIES)
    for name, policy in POLICIES.items():
        assert METHODS[name].policy_class is policy and METHODS[name].Options is policy.Options
        assert (CONF / f"{name}.yaml").exists(), name


def test_other_methods_stay_registered():
    assert {"ar", "layerskip", "assisted", "pld"} <= set(METHODS)
    assert METHODS["sparsespec"].default_controller == "entropy"


def test_a_name_cannot_be_registered_twice():
    with pytest.raises(TypeError, match="'streaming' is taken"):
        type("AnotherStreaming", (policies.KVPolicy,), {"name": "streaming"})


def test_a_new_policy_is_one_class():
    """A policy written here (every other position, fixed) runs losslessly through the generic drafter."""
    class EvenPositions(policies.KVPolicy):
        Options = policies.KVPolicy.Options     # the budget and the draft cache, as most policies

        def scores(self, layer):
            return (torch.arange(4096) % 2 == 0).float().expand(2, 4096)

    model, prompt = build_tiny("llama"), random_prompt(120)
    drafter_cls = SparseKVDrafter.for_policy(EvenPositions)
    ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=16, stop_at_eos=False)
    options = drafter_cls.Options.build({"sink": 2, "recent": 4, "topk": 6, "draft_weights": "full"})
    drafter = drafter_cls(model, prompt_len=120, max_new_tokens=16, max_k=3, options=options)
    positions = select_topk_positions(drafter.policy.draft_scores(0), 120, drafter.policy.budget, 0)
    assert positions.shape == (2, 12) and set(positions[0, 2:8].tolist()) <= set(range(2, 116, 2))
    gen = run_drafter(model, prompt, drafter, new=16, k=3)
    assert gen.tokens == ar.tokens


def make_drafter(model, method, prompt_len, max_new_tokens=8, **options):
    """The drafter `generate` would build, full draft weights unless said otherwise."""
    cls = METHODS[method]
    full = {"draft_weights": "full"} if "draft_weights" in cls.Options.names() else {}
    options = resolve(method, {**full, **options}).drafter_options
    return cls(model, prompt_len=prompt_len, max_new_tokens=max_new_tokens, max_k=4, options=options)


def run_drafter(model, prompt, drafter, new, k):
    from sparsespec.controllers import make_controller
    from sparsespec.api import decode
    controller = make_controller("fixed", k=k)
    with torch.inference_mode(), sparsespec_attention(model):
        return decode(model, prompt.view(-1), drafter, controller, Sampler(), new, set())


# --- observation -----------------------------------------------------------------------------------
def test_one_prefill_fans_out_to_several_observers_and_changes_nothing():
    """Observe-only: the prefill's logits are plain SDPA's, and each method's observer records
    what it records in its own prefill."""
    model, prompt = build_tiny("mistral"), random_prompt(100)     # 64-token window: masks are real
    drafters = [make_drafter(model, m, 100, sink=2, recent=4, topk=8, obs_window=w)
                for m, w in (("sparsespec", 16), ("snapkv_static", 5))]

    def prefill(hook):
        cache = PreallocatedCache(4, 128)
        with torch.inference_mode(), sparsespec_attention(model):
            return model(prompt, past_key_values=cache, use_cache=True, attn_hook=hook).logits

    plain = prefill(None)
    alone = []
    for d in drafters:
        assert prefill(ObservedPrefillHook(d.prefill_observers())).equal(plain)
        alone.append({k: v.clone() for k, v in d.policy.observed.items()})
        d.policy.observed.clear()
    shared = ObservedPrefillHook([o for d in drafters for o in d.prefill_observers()])
    assert prefill(shared).equal(plain)
    for d, own in zip(drafters, alone):
        assert set(d.policy.observed) == set(range(4))
        for layer in own:
            assert torch.equal(d.policy.observed[layer], own[layer])
    assert not torch.equal(drafters[0].policy.observed[0], drafters[1].policy.observed[0])   # 16 vs 5 queries


@pytest.mark.parametrize("method, observes", [("sparsespec", True), ("h2o", True), ("snapkv_static", False),
                                              ("streaming", False), ("quest", False), ("oracle", False)])
def test_only_policies_that_recycle_verification_observe_it(method, observes):
    model = build_tiny("llama")
    options = dict(sink=2, budget=20) if method == "streaming" else dict(sink=2, recent=4, budget=20)
    drafter = make_drafter(model, method, 200, **options)
    assert drafter.budget.total == 20
    assert (drafter.verify_observer() is not None) == observes


def test_h2o_sums_prefill_and_the_kept_verification_queries_only():
    model = build_tiny("llama")
    drafter = make_drafter(model, "h2o", 10, sink=1, recent=1, topk=2)
    policy = drafter.policy
    policy.observed = {layer: torch.ones(2, 10) for layer in range(4)}          # prefill: (Hkv, N)
    state = DecodeState(model=model, cache=None, ids=torch.zeros(20, dtype=torch.long), length=10,
                        prompt_len=10, sampler=Sampler(), max_new_tokens=8)
    policy.after_prefill(state)
    probs = torch.zeros(1, 2, 2, 4, 14)                                          # (B, Hkv, G, q=4, N=14)
    for i in range(4):
        probs[0, :, :, i, 10 + i] = 1.0 + i                                      # query i -> its own position
    probs[0, :, :, :, 3] += 0.5                                                  # every query -> position 3
    for layer in range(4):
        policy.observe_verification(layer, probs)
    policy.after_verify(state, accepted=1)                                       # queries 0 and 1 kept
    expected = torch.zeros(2, 20)
    expected[:, :10] = 1.0
    expected[:, 3] += 2 * 2 * 0.5                                                # 2 kept queries x G=2 heads
    expected[:, 10], expected[:, 11] = 2 * 1.0, 2 * 2.0
    assert torch.equal(policy.scores(0), expected)
    assert policy.scores(0)[:, 12:].eq(0).all()                                  # rejected queries left nothing


# --- Quest -----------------------------------------------------------------------------------------
def test_quest_page_bounds_match_brute_force():
    g = torch.Generator().manual_seed(0)
    hkv, group, n, d, size = 2, 3, 37, 8, 5
    keys = torch.randn(hkv, n, d, generator=g, dtype=torch.float64)
    query = torch.randn(hkv, group, d, generator=g, dtype=torch.float64)
    low, high = page_key_bounds(keys, size)
    bounds = page_upper_bounds(query, low, high)
    pages = -(-n // size)
    assert low.shape == high.shape == (hkv, pages, d)
    for h in range(hkv):
        for p in range(pages):
            page = keys[h, p * size:(p + 1) * size]                              # (<= size, D), last partial
            assert torch.equal(low[h, p], page.min(dim=0).values)
            assert torch.equal(high[h, p], page.max(dim=0).values)
            brute = sum(max(query[h, j, c] * low[h, p, c], query[h, j, c] * high[h, p, c])
                        for j in range(group) for c in range(d))
            assert bounds[h, p].item() == pytest.approx(brute.item(), rel=1e-12, abs=1e-12)
            true_scores = page @ query[h].T                                      # (page, G): q . k per head
            assert (true_scores.sum(dim=1) <= bounds[h, p] + 1e-12).all()        # an upper bound


def quest_policy(model, prompt_len=200, **options):
    return make_drafter(model, "quest", prompt_len, max_new_tokens=64, **options).policy


class FakeCacheState:
    """A DecodeState stand-in whose cache keys are random: (1, Hkv, capacity, D) per layer."""

    def __init__(self, layers=2, hkv=2, capacity=300, d=8, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.cache = PreallocatedCache(layers, capacity)
        for layer in self.cache.layers:
            layer.lazy_initialization(torch.randn(1, hkv, 1, d, generator=g), torch.zeros(1, hkv, 1, d))
            layer.keys.copy_(torch.randn(1, hkv, capacity, d, generator=g))
        self.ids = torch.zeros(capacity, dtype=torch.long)
        self.length = 0


def test_quest_pages_follow_the_cache_as_it_grows_and_rolls_back():
    policy = quest_policy(build_tiny("llama"), sink=4, recent=8, topk=32, page_size=16)
    state = FakeCacheState()
    state.length = 150
    policy.after_prefill(state)
    for length in (155, 160, 161, 158, 190, 176, 177, 240):                    # grow, roll back, grow
        for layer in state.cache.layers:             # the loop (re)writes positions from the shorter length on
            layer.keys[:, :, min(state.length, length):length] += 1.0
        state.length = length
        policy.after_verify(state, accepted=0)
        for i, layer in enumerate(state.cache.layers):
            low, high = page_key_bounds(layer.keys[0, :, :length], 16)
            pages = low.shape[1]
            assert torch.equal(policy.low[i][:, :pages], low), length
            assert torch.equal(policy.high[i][:, :pages], high), length


def test_quest_selects_sinks_recent_and_the_top_pages_by_bound():
    policy = quest_policy(build_tiny("llama"), sink=4, recent=8, topk=40, page_size=16)   # 2 whole pages
    state = FakeCacheState()
    state.length = 200
    policy.after_prefill(state)
    g = torch.Generator().manual_seed(1)
    for layer in range(2):
        query = torch.randn(1, 4, 1, 8, generator=g)                             # 4 query heads, G = 2
        positions = policy.select_for_query(layer, query, state.cache.layers[layer].keys[:, :, :200], None,
                                            1.0, 200, 0)
        keys = state.cache.layers[layer].keys[0, :, :200]
        for h in range(2):
            chosen = set(positions[h].tolist())
            assert len(chosen) == positions.shape[1] == 4 + 32 + 8               # within the budget of 52
            assert set(range(4)) <= chosen and set(range(192, 200)) <= chosen
            # brute force: whole pages inside [4, 192) are pages 1..11; bound per page from the keys
            q = query[0, 2 * h:2 * h + 2, 0]                                     # (G, D)
            bounds = {}
            for p in range(1, 12):
                page = keys[h, p * 16:(p + 1) * 16]
                lo, hi = page.min(dim=0).values, page.max(dim=0).values
                bounds[p] = torch.maximum(q * lo, q * hi).sum().item()
            best = sorted(bounds, key=bounds.get)[-2:]
            assert chosen - set(range(4)) - set(range(192, 200)) == {p * 16 + i for p in best for i in range(16)}


def test_quest_with_a_topk_share_smaller_than_a_page_keeps_sinks_and_recent():
    policy = quest_policy(build_tiny("llama"), sink=2, recent=6, topk=10, page_size=16)
    state = FakeCacheState()
    state.length = 100
    policy.after_prefill(state)
    positions = policy.select_for_query(0, torch.randn(1, 4, 1, 8), state.cache.layers[0].keys[:, :, :100],
                                        None, 1.0, 100, 0)
    assert positions[0].tolist() == [0, 1, 94, 95, 96, 97, 98, 99]


# --- budget rules (#16) ----------------------------------------------------------------------------
@pytest.mark.parametrize("method", [m for m in POLICY_METHODS if m != "streaming"])   # streaming: no topk
def test_no_position_at_all_is_a_one_line_config_error(method):
    with pytest.raises(ConfigError, match="sink=0 recent=0 topk=0 leaves the draft no position") as err:
        resolve(method, dict(sink=0, recent=0, topk=0))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("method", POLICY_METHODS)
def test_default_options_on_a_short_prompt_draft_dense_and_say_so(method):
    """budget=0.1 of 100 tokens is 10 positions, fewer than sink+recent=68: dense draft, not an error."""
    model, prompt = build_tiny("llama"), random_prompt(100, seed=5)
    ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=20, stop_at_eos=False)
    gen = sparsespec.generate(model, prompt, method=method, max_new_tokens=20, stop_at_eos=False)
    assert gen.tokens == ar.tokens
    if method == "streaming":                          # 4 sinks + 6 recent fit in 10 positions
        assert "dense_draft" not in gen.options
    else:
        assert gen.options["dense_draft"] is True
        assert gen.options["budget_note"] == ("budget=0.1 gives 10 positions at context 100, fewer than "
                                              "sink+recent=68: dense draft")


@pytest.mark.parametrize("over", [dict(topk=500), dict(budget=500)], ids=["topk", "budget"])
def test_topk_and_budget_beyond_the_context_are_both_a_dense_draft(over):
    model, prompt = build_tiny("llama"), random_prompt(100, seed=6)
    ar = sparsespec.generate(model, prompt, method="ar", max_new_tokens=24, stop_at_eos=False)
    gen = sparsespec.generate(model, prompt, method="sparsespec", controller="fixed", k=4, draft_weights="full",
                              max_new_tokens=24, stop_at_eos=False, **over)
    assert gen.tokens == ar.tokens
    assert gen.acceptance_rate == 1.0                                            # dense: the target itself
    assert gen.options["dense_draft"] is True and "cover the whole 100-token prompt" in gen.options["budget_note"]


def test_a_sparse_budget_gets_no_note():
    gen = sparsespec.generate(build_tiny("llama"), random_prompt(200), method="sparsespec", recent=8, budget=40,
                              max_new_tokens=6, stop_at_eos=False)
    assert "dense_draft" not in gen.options and "budget_note" not in gen.options


def test_dense_budget_spans_the_whole_generation():
    policy = quest_policy(build_tiny("llama"), prompt_len=50, sink=4, recent=64, budget=0.1)
    assert policy.budget == Budget(0, 50 + 64, 0) and policy.budget_note
