"""One prefill per prompt (sparsespec/engine/prefill.py): every method started from a prefill it
shares with all the others emits exactly the tokens it emits after its own prefill, on Llama,
Mistral (sliding window) and Qwen2 (mixed layers), and no method changes the shared state."""
from __future__ import annotations

import pytest
import torch

import sparsespec
from conftest import ARCHS, build_tiny, random_prompt, slow_but
from sparsespec import ConfigError
from sparsespec.api import sparsespec_attention
from sparsespec.methods import METHODS
from sparsespec.engine.prefill import PrefillMemo

NEW = 24
PROMPT_LEN = 300
TINY_BUDGET = dict(sink=2, recent=4, topk=4)
MID_BUDGET = dict(sink=4, recent=16, budget=0.2)
OPTIONS = {        # every engine method, with options that make it draft on a 300-token prompt
    "ar": {},
    "sparsespec": dict(TINY_BUDGET),
    "streaming": dict(k=4, sink=2, budget=24),
    "snapkv_static": dict(k=4, **MID_BUDGET),
    "oracle": dict(k=4, **TINY_BUDGET),
    "h2o": dict(k=4, **MID_BUDGET),
    "quest": dict(k=4, sink=2, recent=4, topk=16, page_size=4),
    "layerskip": dict(k=3, exit_layer=2),
    "assisted": dict(k=4, draft_model="truncated:2"),
    "pld": dict(k=5),
}
# a second controller on the same drafter, so two observers of one kind share the forward
RUNS = {**{m: (m, o) for m, o in OPTIONS.items()},
        "sparsespec_fixed": ("sparsespec", dict(controller="fixed", k=4, **MID_BUDGET))}
# The entropy controller weighs measured (wall-clock) costs, so its k, and under sampling its
# tokens, vary from run to run; its greedy tokens do not (lossless).
TIMED = {"sparsespec"}


def prompt_with_repeat() -> torch.Tensor:
    prompt = random_prompt(PROMPT_LEN)
    prompt[0, 200:260] = prompt[0, 100:160]          # something for prompt lookup to find
    return prompt


def snapshot(shared) -> list[tuple[torch.Tensor, torch.Tensor]]:
    n = shared.prompt.numel()
    return [(layer.keys[:, :, :n].clone(), layer.values[:, :, :n].clone()) for layer in shared.cache.layers]


def test_every_method_is_covered():
    assert set(OPTIONS) == set(METHODS), "add the new method to OPTIONS"


@pytest.mark.slow
@pytest.mark.parametrize("arch, sampling", [(arch, False) for arch in ARCHS] + [("llama", True)],
                         ids=[*ARCHS, "llama-sampled"])
def test_shared_prefill_gives_each_method_its_own_tokens(arch, sampling):
    model = build_tiny(arch)
    prompt = prompt_with_repeat()
    decoding = dict(temperature=0.8, top_p=0.9, seed=7) if sampling else {}
    runs = {label: run for label, run in RUNS.items() if not (sampling and label in TIMED)}
    alone = {label: sparsespec.generate(model, prompt, method=m, max_new_tokens=NEW, stop_at_eos=False,
                                        **decoding, **o) for label, (m, o) in runs.items()}
    starts = sparsespec.prefill(model, prompt, methods=runs, max_new_tokens=NEW)
    shared = next(iter(starts.values())).shared
    assert all(start.shared is shared for start in starts.values())       # one forward for all
    before, logits = snapshot(shared), shared.logits.clone()
    for label in reversed(list(runs)):                                     # another order than above
        gen = sparsespec.generate(model, prompt, prefilled=starts[label], stop_at_eos=False, **decoding)
        assert gen.tokens == alone[label].tokens, label
        if label not in TIMED:
            assert [r.accepted for r in gen.rounds] == [r.accepted for r in alone[label].rounds], label
        assert gen.method == runs[label][0] and gen.prefill_s >= shared.seconds
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(before, snapshot(shared)))
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(before, snapshot(shared)))
    assert torch.equal(logits, shared.logits)
    if not sampling:
        assert any(alone[label].acceptance_rate > 0 for label in runs if label != "ar"), "nothing was accepted"


def test_a_prefill_serves_one_generate_of_its_own_method():
    model = build_tiny("llama")
    prompt = prompt_with_repeat()
    starts = sparsespec.prefill(model, prompt, methods={"ar": ("ar", {}), "pld": ("pld", {"k": 3})}, max_new_tokens=8)
    with pytest.raises(ConfigError, match="decodes the method and options given to prefill"):
        sparsespec.generate(model, prompt, prefilled=starts["ar"], method="pld")
    with pytest.raises(ConfigError, match="max_new_tokens=9 differs"):
        sparsespec.generate(model, prompt, prefilled=starts["ar"], max_new_tokens=9)
    with pytest.raises(ConfigError, match="input_ids differ"):
        sparsespec.generate(model, prompt[:, 1:], prefilled=starts["ar"])
    sparsespec.generate(model, prompt, prefilled=starts["ar"])
    with pytest.raises(ConfigError, match="decoded already"):
        sparsespec.generate(model, prompt, prefilled=starts["ar"])
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        sparsespec.prefill(model, prompt, methods={"x": ("nope", {})})


# --- prefills kept across calls (PrefillMemo) --------------------------------------------------

@pytest.mark.parametrize("arch", slow_but("mistral", ARCHS))   # ~6-8 s an architecture
def test_a_kept_prefill_replays_the_observers_exactly(arch, prefill_forwards):
    """A prefill served by the memo runs no forward, and every method decodes from it exactly as from
    its own prefill: the same tokens and (untimed controllers) the same accepted drafts each round, so
    the observers saw the same scores; on Llama, Mistral (sliding-window mask rows) and Qwen2."""
    forwards = prefill_forwards
    model = build_tiny(arch)
    prompt = prompt_with_repeat()
    memo = PrefillMemo(max_bytes=2**30)
    fresh = sparsespec.prefill(model, prompt, methods=RUNS, max_new_tokens=NEW)
    first = sparsespec.prefill(model, prompt, methods=RUNS, max_new_tokens=NEW, memo=memo)
    kept = sparsespec.prefill(model, prompt, methods=RUNS, max_new_tokens=NEW, memo=memo)
    assert (memo.misses, memo.hits, len(forwards)) == (1, 1, 2)       # fresh, then kept: the third ran none
    assert kept["ar"].shared.reused and not first["ar"].shared.reused
    assert kept["ar"].shared.seconds == first["ar"].shared.seconds > 0                # the kept forward's time
    observed = kept["snapkv_static"].drafter.policy.observed
    assert len(observed) == model.config.num_hidden_layers
    for layer, scores in fresh["snapkv_static"].drafter.policy.observed.items():
        torch.testing.assert_close(observed[layer], scores, rtol=0, atol=1e-6)
    accepted = {}
    for label in RUNS:
        a = sparsespec.generate(model, prompt, prefilled=fresh[label], stop_at_eos=False)
        b = sparsespec.generate(model, prompt, prefilled=kept[label], stop_at_eos=False)
        assert b.tokens == a.tokens, label
        if label not in TIMED:
            assert [r.accepted for r in b.rounds] == [r.accepted for r in a.rounds], label
        accepted[label] = sum(r.accepted for r in a.rounds)
    assert accepted["snapkv_static"] + accepted["h2o"] + accepted["sparsespec_fixed"] > 0, "nothing was accepted"


def test_the_memo_misses_another_model_a_wider_window_and_anything_past_its_bytes(prefill_forwards):
    forwards = prefill_forwards
    prompt, other_prompt = prompt_with_repeat(), random_prompt(200, seed=5)
    model, other_model = build_tiny("llama"), build_tiny("llama", seed=1)
    snapkv = lambda window: {"s": ("snapkv_static", dict(k=4, obs_window=window, **MID_BUDGET))}
    memo = PrefillMemo(max_bytes=2**30, min_rows=32)
    sparsespec.prefill(model, prompt, methods=snapkv(16), max_new_tokens=8, memo=memo)
    sparsespec.prefill(other_model, prompt, methods=snapkv(16), max_new_tokens=8, memo=memo)   # other weights
    sparsespec.prefill(model, prompt, methods=snapkv(48), max_new_tokens=8, memo=memo)         # 48 > 32 rows kept
    sparsespec.prefill(model, prompt, methods=snapkv(40), max_new_tokens=8, memo=memo)         # now 48 are kept
    assert (memo.misses, memo.hits, len(forwards)) == (3, 1, 3)
    assert list(memo.kept) == [memo.key_of(model, prompt)]  # a prefill of another model drops the previous one's

    one = memo.kept[memo.key_of(model, prompt)].nbytes
    memo.resize(one)                                       # room for one prompt: the least recent goes
    sparsespec.prefill(model, other_prompt, methods=snapkv(16), max_new_tokens=8, memo=memo)
    assert list(memo.kept) == [memo.key_of(model, other_prompt)] and memo.nbytes <= one
    memo.resize(0)                                         # off: keeps nothing, serves nothing
    sparsespec.prefill(model, other_prompt, methods=snapkv(16), max_new_tokens=8, memo=memo)
    assert not memo.kept and memo.hits == 1 and len(forwards) == 5

    with sparsespec_attention(model):                      # observers that may read every query: never kept
        PrefillMemo(max_bytes=2**30).serve(model, prompt.view(-1), [lambda *a: None], query_rows=None)
    assert len(forwards) == 6
