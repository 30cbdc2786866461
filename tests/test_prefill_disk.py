"""Prefills kept on disk (sparsespec/engine/prefill_disk.py, `PrefillMemo(disk_dir=...)`): a new memo (as in
a new process) decodes from a prefill read back from disk exactly as from a fresh one; an unreadable or
foreign file is ignored with one warning and prefilled again; the folder keeps its cap, the least
recently used files going first; the key follows the weights and the prompt."""
from __future__ import annotations

import logging
import os
import time

import pytest
import torch

import sparsespec
from conftest import build_tiny, random_prompt, slow_but
from sparsespec.engine.prefill_disk import STALE_S, SUFFIX
from sparsespec.engine.prefill import PrefillMemo

NEW = 20
MID_BUDGET = dict(sink=4, recent=16, budget=0.2)
RUNS = {            # AR, two observing drafters (untimed controllers) and one that reads the prompt's ids
    "ar": ("ar", {}),
    "snapkv_static": ("snapkv_static", dict(k=4, **MID_BUDGET)),
    "sparsespec_fixed": ("sparsespec", dict(controller="fixed", k=4, **MID_BUDGET)),
    "pld": ("pld", dict(k=5)),
}
GIB = 2**30


def prompt_with_repeat(length: int = 300, seed: int = 1) -> torch.Tensor:
    prompt = random_prompt(length, seed=seed)
    prompt[0, 200:260] = prompt[0, 100:160]          # something for prompt lookup to find
    return prompt


def files(folder) -> list:
    return sorted(folder.glob("*" + SUFFIX))


@pytest.mark.parametrize("arch, sampling", slow_but("llama", [("llama", False), ("mistral", False), ("llama-sampled", True)]),
                         ids=["llama", "mistral", "llama-sampled"])
def test_a_prefill_read_back_from_disk_decodes_exactly_as_a_fresh_one(arch, sampling, tmp_path, prefill_forwards):
    forwards = prefill_forwards
    model = build_tiny(arch.removesuffix("-sampled"))
    prompt = prompt_with_repeat()
    decoding = dict(temperature=0.8, top_p=0.9, seed=7) if sampling else {}
    writer = PrefillMemo(disk_dir=tmp_path, disk_bytes=GIB)                   # memory off: disk only
    fresh = sparsespec.prefill(model, prompt, methods=RUNS, max_new_tokens=NEW, memo=writer)
    assert len(files(tmp_path)) == 1 and (writer.misses, writer.disk_hits) == (1, 0)
    reader = PrefillMemo(disk_dir=tmp_path, disk_bytes=GIB)                   # another process's memo
    loaded = sparsespec.prefill(model, prompt, methods=RUNS, max_new_tokens=NEW, memo=reader)
    assert len(forwards) == 1 and (reader.hits, reader.disk_hits, reader.misses) == (1, 1, 0)
    assert loaded["ar"].shared.reused and loaded["ar"].shared.seconds == fresh["ar"].shared.seconds
    observed = loaded["snapkv_static"].drafter.policy.observed
    assert len(observed) == model.config.num_hidden_layers
    for layer, scores in fresh["snapkv_static"].drafter.policy.observed.items():
        torch.testing.assert_close(observed[layer], scores, rtol=0, atol=1e-6)
    accepted = 0
    for label in RUNS:
        a = sparsespec.generate(model, prompt, prefilled=fresh[label], stop_at_eos=False, **decoding)
        b = sparsespec.generate(model, prompt, prefilled=loaded[label], stop_at_eos=False, **decoding)
        assert b.tokens == a.tokens, label
        assert [r.accepted for r in b.rounds] == [r.accepted for r in a.rounds], label
        accepted += sum(r.accepted for r in a.rounds) if label != "ar" else 0
    assert accepted > 0, "nothing was accepted"


@pytest.mark.parametrize("damage", ["truncated", "garbage", "another prompt's file"])
def test_an_unreadable_or_foreign_file_is_ignored_with_one_warning(damage, tmp_path, prefill_forwards, caplog):
    forwards = prefill_forwards
    model = build_tiny("llama")
    prompt, other = prompt_with_repeat(), prompt_with_repeat(seed=3)
    methods = {"s": RUNS["snapkv_static"]}
    memo = PrefillMemo(disk_dir=tmp_path, disk_bytes=GIB)
    sparsespec.prefill(model, prompt, methods=methods, max_new_tokens=8, memo=memo)
    path = memo.disk.path_of(memo.key_of(model, prompt))
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:1000])
    elif damage == "garbage":
        path.write_bytes(b"not a prefill")
    else:                        # the other prompt's fields renamed into this prompt's place
        sparsespec.prefill(model, other, methods=methods, max_new_tokens=8, memo=memo)
        memo.disk.path_of(memo.key_of(model, other)).replace(path)
    forwards.clear()
    caplog.clear()
    reader = PrefillMemo(disk_dir=tmp_path, disk_bytes=GIB)
    with caplog.at_level(logging.WARNING):
        start = sparsespec.prefill(model, prompt, methods=methods, max_new_tokens=8, memo=reader)["s"]
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "prefill cache: ignoring" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()
    assert forwards == [prompt.numel()] and reader.disk_hits == 0 and not start.shared.reused  # prefilled again
    again = PrefillMemo(disk_dir=tmp_path, disk_bytes=GIB)                 # ... and rewritten whole
    sparsespec.prefill(model, prompt, methods=methods, max_new_tokens=8, memo=again)
    assert again.disk_hits == 1 and forwards == [prompt.numel()]


def test_the_folder_keeps_its_cap_dropping_the_least_recently_used(tmp_path, prefill_forwards):
    forwards = prefill_forwards
    model = build_tiny("llama")
    prompts = [prompt_with_repeat(seed=s) for s in (1, 2, 3)]
    methods = {"s": RUNS["snapkv_static"]}

    def prefill(prompt, cap):
        memo = PrefillMemo(disk_dir=tmp_path, disk_bytes=cap)                  # a new process each time
        sparsespec.prefill(model, prompt, methods=methods, max_new_tokens=8, memo=memo)
        time.sleep(0.05)                                                       # distinct modification times
        return memo

    one = prefill(prompts[0], GIB)
    size = files(tmp_path)[0].stat().st_size
    cap = int(2.5 * size)                                                      # room for two files
    prefill(prompts[1], cap)
    assert prefill(prompts[0], cap).disk_hits == 1                             # prompt 0 is now the most recent
    prefill(prompts[2], cap)                                                   # evicts prompt 1
    names = {p.name for p in files(tmp_path)}
    assert names == {one.disk.path_of(one.key_of(model, p)).name for p in (prompts[0], prompts[2])}
    assert one.disk.nbytes <= cap and len(forwards) == 3
    dead, writing = tmp_path / f".x{SUFFIX}.1.tmp", tmp_path / f".y{SUFFIX}.2.tmp"   # a died writer's, a live one's
    dead.write_bytes(b"x"), writing.write_bytes(b"y")
    os.utime(dead, (time.time() - 2 * STALE_S,) * 2)
    small = prefill(prompt_with_repeat(seed=4), size // 2)
    assert not dead.exists() and writing.exists()   # a smaller cap: the folder shrinks to it, and a
    assert small.disk.nbytes == 0 and len(forwards) == 4     # prefill larger than the cap is not written


def test_the_key_follows_the_weights_and_the_prompt(tmp_path, prefill_forwards):
    forwards = prefill_forwards
    model, other_model = build_tiny("llama"), build_tiny("llama")
    with torch.no_grad():
        next(other_model.parameters()).view(-1)[0] += 1e-3                  # one weight, in a sampled position
    prompt = prompt_with_repeat()
    changed = prompt.clone()
    changed[0, -1] = (changed[0, -1] % 127) + 1                              # one token, another id
    memo = PrefillMemo(disk_dir=tmp_path, disk_bytes=GIB)
    keys = {memo.key_of(model, prompt), memo.key_of(other_model, prompt), memo.key_of(model, changed)}
    assert len(keys) == 3
    methods = {"s": RUNS["snapkv_static"]}
    for m, p in [(model, prompt), (other_model, prompt), (model, changed)]:
        sparsespec.prefill(m, p, methods=methods, max_new_tokens=8, memo=PrefillMemo(disk_dir=tmp_path, disk_bytes=GIB))
    assert len(forwards) == 3 and len(files(tmp_path)) == 3                   # none served another's


@pytest.mark.slow   # the harness in-process, twice
def test_a_later_run_of_the_harness_takes_its_prefills_from_the_cache_folder(harness_run, tmp_path, monkeypatch,
                                                                              prefill_forwards):
    """`prefill_cache_dir`: a second run (a new memo, as in a new process) of another method on the
    same prompts runs no prefill forward, says so in its summary, and stays lossless."""
    import sparsespec.harness.decoding as decoding
    run, _, prompts = harness_run
    forwards = prefill_forwards
    common = ("num_prompts=3", "warmup=false", "cost_profile=false", f"prefill_cache_dir={tmp_path / 'cache'}")
    monkeypatch.setattr(decoding, "PREFILL_MEMO", PrefillMemo())
    first = run(tmp_path / "first", *common, "bench.methods=['snapkv_static:k=3,budget=0.3']")
    assert len(forwards) == 3 and len(files(tmp_path / "cache")) == 3
    monkeypatch.setattr(decoding, "PREFILL_MEMO", PrefillMemo())                 # the next process
    second = run(tmp_path / "second", *common, "bench.methods=['streaming:k=3,budget=0.3']")
    assert len(forwards) == 3                                                  # none ran
    for entry, summary in first.items():
        assert summary["run"]["prefills_from_disk"] == 0
    for entry, summary in second.items():
        assert summary["run"]["prefills_from_disk"] == summary["run"]["prefills_reused"] == 3, entry
    assert second["streaming:k=3,budget=0.3"]["metrics"]["outputs_match_ar"] == 1.0
