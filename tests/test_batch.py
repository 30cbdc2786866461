"""Batched decoding (sparsespec/engine/loop.py) is lossless per sequence: under greedy, every sequence of a
batch is token-identical to its prompt decoded alone with AR (fp32, Llama, Mistral with a sliding
window, Qwen2 with mixed layers), at mixed prompt lengths and with budgets that force rejections;
under sampling, the joint output of a batch is exactly the product of the model's distributions.
A method that is not batchable decodes a batch one sequence at a time, with the same guarantees."""
from __future__ import annotations

import json
import math

import pandas as pd

import pytest
import torch

import sparsespec
from conftest import ARCHS, build_tiny, random_prompt, slow_but
from sparsespec.engine import loop
from sparsespec.errors import ConfigError
from sparsespec.engine.sampling import Sampler
from helpers import VOCAB, enumerate_outputs, model_distribution, total_variation

NEW = 32
LENGTHS = (300, 90, 200, 40)    # past the 64-token sliding window and below it; 40 < every budget: dense

TINY_BUDGET = dict(sink=2, recent=4, topk=4)      # 10 of 300 positions: drafts almost always rejected
# 74 of 300 positions: acceptance mid-range on every architecture, so the sequences of a batch accept
# different counts in one round (at TINY_BUDGET nearly every round accepts 0 on every sequence, and whether
# one round differs turns on float rounding, which differs between CPUs)
MIXED_BUDGET = dict(sink=2, recent=8, topk=64)
MID_BUDGET = dict(sink=4, recent=16, budget=0.2)
CASES = {
    "ar": ("ar", {}),
    "sparsespec-fixed-mixed": ("sparsespec", dict(controller="fixed", k=4, **MIXED_BUDGET)),
    "sparsespec-entropy-mid": ("sparsespec", dict(controller="entropy", **MID_BUDGET)),
    "sparsespec-fixed-over": ("sparsespec", dict(controller="fixed", k=5, budget=10_000, draft_weights="full")),
    "streaming": ("streaming", dict(k=4, sink=2, budget=24)),
    "snapkv_static": ("snapkv_static", dict(k=4, **MID_BUDGET)),
    "h2o-fixed-mixed": ("h2o", dict(controller="fixed", k=3, **MIXED_BUDGET)),
    "pld": ("pld", dict(k=5)),
    "layerskip": ("layerskip", dict(k=3, exit_layer=2)),
    "layerskip-entropy": ("layerskip", dict(controller="entropy", exit_layer=3, draft_weights="full")),
}


def prompts_for(lengths=LENGTHS):
    out = [random_prompt(n, seed=n)[0] for n in lengths]
    out[0][200:260] = out[0][100:160]
    return out


@pytest.fixture(scope="module")
def references():
    """Per architecture: the model, the prompts and each prompt's AR output decoded alone."""
    out = {}
    for arch in ARCHS:
        model = build_tiny(arch)
        prompts = prompts_for()
        alone = [sparsespec.generate(model, p, method="ar", max_new_tokens=NEW, stop_at_eos=False).tokens
                 for p in prompts]
        out[arch] = (model, prompts, alone)
    return out


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("arch", ARCHS)
def test_batch_greedy_is_token_identical_to_ar_alone(references, arch, case):
    model, prompts, alone = references[arch]
    method, options = CASES[case]
    gens = sparsespec.generate(model, prompts, method=method, max_new_tokens=NEW, stop_at_eos=False, **options)
    assert isinstance(gens, loop.BatchGenerations) and len(gens) == len(prompts) == gens.batch_size
    for b, (gen, ref) in enumerate(zip(gens, alone)):
        assert gen.tokens == ref, (case, arch, b)
        assert gen.prompt_tokens == LENGTHS[b]
        assert 1 + sum(r.emitted for r in gen.rounds) == len(gen.tokens) == NEW
        assert all(0 <= r.accepted <= r.drafted for r in gen.rounds)
    if case.endswith("-mixed"):    # sequences accept different counts in a round, and drafts get rejected
        assert any(r.accepted < r.drafted for g in gens for r in g.rounds)
        assert any(len({g.rounds[i].accepted for g in gens if len(g.rounds) > i}) > 1
                   for i in range(min(len(g.rounds) for g in gens)))
    if method != "ar":
        assert any(r.drafted for g in gens for r in g.rounds), "nothing was drafted: the case proves nothing"
    if case.endswith("-over"):
        assert all(g.acceptance_rate == 1.0 for g in gens)
    assert gens.tokens_per_s > 0 and gens.decode_s >= max(g.decode_s for g in gens) * 0.999


@pytest.mark.parametrize("arch", slow_but((), ARCHS))   # ~6-7 s an architecture: `make test` (fast tier: test_shared_prefill)
def test_batch_from_shared_prefills_is_token_identical(references, arch):
    """Every batched method decoding from one shared prefill per prompt (what the harness's batch
    mode does) emits exactly what it emits after its own prefills, and what AR emits alone."""
    model, prompts, alone = references[arch]
    methods = {case: CASES[case] for case in ("sparsespec-fixed-mixed", "sparsespec-entropy-mid", "streaming",
                                              "snapkv_static", "pld", "layerskip", "ar")}
    starts = [sparsespec.prefill(model, p, methods=methods, max_new_tokens=NEW) for p in prompts]
    for case, (method, options) in methods.items():
        own = sparsespec.generate(model, prompts, method=method, max_new_tokens=NEW, stop_at_eos=False, **options)
        shared = sparsespec.generate(model, prompts, prefilled=[s.pop(case) for s in starts], stop_at_eos=False)
        assert [g.tokens for g in shared] == [g.tokens for g in own] == alone, (arch, case)
        if case != "sparsespec-entropy-mid":   # its k follows the round times it measures, so its rounds vary with load
            assert [len(g.rounds) for g in shared] == [len(g.rounds) for g in own], (arch, case)
        assert all(g.method == method and g.options["batch_size"] == len(prompts) for g in shared)


def test_batch_prefills_must_match_the_batch(references):
    model, prompts, _ = references["llama"]
    methods = {"a": ("streaming", dict(k=4, sink=2, budget=24)), "b": ("ar", {})}
    starts = [sparsespec.prefill(model, p, methods=methods, max_new_tokens=8) for p in prompts[:2]]
    with pytest.raises(ConfigError, match="one prefill per prompt: got 1 for 2"):
        sparsespec.generate(model, prompts[:2], prefilled=[starts[0]["a"]])
    with pytest.raises(ConfigError, match="a batch decodes one method"):
        sparsespec.generate(model, prompts[:2], prefilled=[starts[0]["a"], starts[1]["b"]])
    with pytest.raises(ConfigError, match="input_ids differ"):
        sparsespec.generate(model, prompts[1::-1], prefilled=[starts[0]["a"], starts[1]["a"]])
    sparsespec.generate(model, prompts[:2], prefilled=[starts[0]["a"], starts[1]["a"]])
    with pytest.raises(ConfigError, match="decoded already"):
        sparsespec.generate(model, prompts[:2], prefilled=[starts[0]["a"], starts[1]["a"]])


def test_padded_ids_with_attention_mask_equal_a_list(references):
    model, prompts, alone = references["mistral"]
    prompts = prompts[1:3]                                   # 90 and 200 tokens
    width = max(p.numel() for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):                          # left padding, as tokenizers do for decoding
        ids[b, width - p.numel():], mask[b, width - p.numel():] = p, 1
    gens = sparsespec.generate(model, ids, attention_mask=mask, method="sparsespec", controller="fixed", k=3,
                               max_new_tokens=NEW, stop_at_eos=False, **TINY_BUDGET)
    assert [g.tokens for g in gens] == alone[1:3]


def test_two_dim_batch_of_equal_lengths_and_single_row_stay_apart(references):
    model, prompts, alone = references["llama"]
    rows = torch.stack([prompts[0][:90], prompts[1]])       # (2, 90), no mask: every token counts
    gens = sparsespec.generate(model, rows, method="ar", max_new_tokens=8, stop_at_eos=False)
    assert gens[1].tokens == alone[1][:8]
    single = sparsespec.generate(model, prompts[1].view(1, -1), method="ar", max_new_tokens=8, stop_at_eos=False)
    assert isinstance(single, sparsespec.Generation)          # (1, L): one prompt, the single-sequence loop


def test_finished_sequences_leave_the_batch(references, monkeypatch):
    """A sequence that hits EOS stops there, like alone, and its rows leave the cache."""
    model, prompts, alone = references["qwen2"]
    eos = alone[1][5]                                         # sequence 1 produces it early
    stops = [ref.index(eos) + 1 if eos in ref else NEW for ref in alone]
    kept = []
    original = loop.BatchCache.keep
    monkeypatch.setattr(loop.BatchCache, "keep", lambda self, rows: (kept.append(list(rows)), original(self, rows)))
    gens = sparsespec.generate(model, prompts, method="sparsespec", controller="fixed", k=4, max_new_tokens=NEW,
                               eos_token_id=eos, **TINY_BUDGET)
    for gen, ref, stop in zip(gens, alone, stops):
        assert gen.tokens == ref[:stop]
    assert kept and all(len(rows) < len(prompts) for rows in kept)
    assert len(gens[1].rounds) < max(len(g.rounds) for g in gens)
    assert gens[1].decode_s < gens.decode_s                  # its latency ends when it finishes


@pytest.mark.parametrize("first_is_eos", [False, True])
def test_a_batch_that_ends_at_its_first_token_returns_that_token(references, first_is_eos):
    """max_new_tokens=1, or every sequence's first token an EOS: nothing is left to decode."""
    model, prompts, alone = references["llama"]
    eos = alone[0][0] if first_is_eos else None
    gens = sparsespec.generate(model, [prompts[0], prompts[0]], method="sparsespec",
                               max_new_tokens=NEW if first_is_eos else 1, eos_token_id=eos,
                               stop_at_eos=first_is_eos, **TINY_BUDGET)
    assert [g.tokens for g in gens] == [[alone[0][0]]] * 2
    assert all(not g.rounds for g in gens)


def test_entropy_controller_picks_one_k_and_traces_each_sequence(references):
    model, prompts, alone = references["llama"]
    gens = sparsespec.generate(model, prompts, method="sparsespec", max_new_tokens=NEW, stop_at_eos=False,
                               warmup_rounds=1, fallback=False,   # the rule in charge: random drafts lose to AR
                               **MID_BUDGET)
    assert [g.tokens for g in gens] == alone
    for i in range(min(len(g.rounds) for g in gens)):
        assert len({g.rounds[i].drafted for g in gens}) == 1            # one k per round for the batch
    traced = [r for g in gens for r in g.rounds if r.survival]
    assert traced, "the online rule never ran"
    assert all(len(r.entropies) == r.drafted for g in gens for r in g.rounds)


def test_batch_rule_is_the_mean_survival():
    from sparsespec.controllers import EntropyController
    from sparsespec.controllers.cost_models import survival
    c = EntropyController(warmup_rounds=0, candidates=(1, 2, 3, 4), fallback=False)
    c.mu_acc, c.mu_rej, c.c_draft = 0.5, 3.0, 1.0
    c.c_verify.add(1, 4.0)
    c.n_accepted, c.n_rejected = 10, 3
    c.start_round(limit=4)
    entropies = [[0.4, 0.6, 2.9], [2.5, 0.1, 0.2]]
    for j in range(1, 4):
        c.keep_drafting_batch([e[:j] for e in entropies])
    expected = [sum(survival([c.acceptance(h) for h in e[:j]])[-1] for e in entropies) / 2 for j in range(1, 4)]
    assert survival(c._probs) == pytest.approx(expected[:len(c._probs)])


ONE_AT_A_TIME = {     # drafters that are not batchable: a batch of them decodes one sequence at a time
    "oracle": ("oracle", dict(k=4, **TINY_BUDGET)),
    "quest": ("quest", dict(controller="fixed", k=4, page_size=2, **TINY_BUDGET)),
    "assisted": ("assisted", dict(k=3, draft_model="truncated:1")),
    "sparsespec-static": ("sparsespec", dict(controller="fixed", k=4, static_draft=True, **TINY_BUDGET)),
}


@pytest.mark.parametrize("arch, case", [   # ~1-2 s a case: the fast tier keeps llama with quest
    pytest.param(a, c, marks=() if (a, c) == ("llama", "quest") else pytest.mark.slow)
    for a in ARCHS for c in sorted(ONE_AT_A_TIME)])
def test_methods_not_batched_decode_a_batch_one_sequence_at_a_time(references, arch, case):
    """Greedy: each sequence equals AR alone; each row has its own decode time and the batch's is
    their sum (the timing rule itself: test_rows_one_after_another_keep_their_own_times)."""
    model, prompts, alone = references[arch]
    method, options = ONE_AT_A_TIME[case]
    rows = prompts[1:]                                        # 90, 200 and 40 tokens
    gens = sparsespec.generate(model, rows, method=method, max_new_tokens=NEW, stop_at_eos=False, **options)
    assert isinstance(gens, loop.BatchGenerations) and len(gens) == gens.batch_size == len(rows)
    assert [g.tokens for g in gens] == alone[1:], (arch, case)
    assert [g.prompt_tokens for g in gens] == list(LENGTHS[1:])
    assert all(g.options["batch_size"] == len(rows) and g.method == method for g in gens)
    assert any(r.drafted for g in gens for r in g.rounds), "nothing was drafted: the case proves nothing"
    assert all(g.decode_s > 0 for g in gens) and gens.decode_s == pytest.approx(sum(g.decode_s for g in gens))
    assert gens.prefill_s == pytest.approx(sum(g.prefill_s for g in gens))


def rows_decoded_by_the_loop(monkeypatch, rows):
    """`rows` (Generations) as `decode_each` returns them, each row's part stubbed to take longer than
    its row (the loop's clock stops after the row's end)."""
    parts = iter(rows)

    def one_part(model, starts, sampler, stop_ids, cost_prior=None, ar_attention=None, thread_rule=None):
        part = loop.BatchGenerations([next(parts)])
        part.decode_s, part.prefill_s, part.batch_size = part[0].decode_s + 0.5, part[0].prefill_s, 1
        return part
    monkeypatch.setattr(loop, "decode_together", one_part)
    return loop.decode_each(None, [object()] * len(rows), Sampler(), set())


def rows_decoded_by_transformers(monkeypatch, rows):
    """`rows` as the harness's batch of a transformers reference decoder (hf_generate) returns them."""
    from omegaconf import OmegaConf

    from sparsespec import hf_reference
    from sparsespec.harness import decoding
    parts = iter(rows)
    monkeypatch.setattr(hf_reference, "hf_generate", lambda model, prompt, **kwargs: next(parts))
    config = OmegaConf.create({"temperature": 0.0, "top_p": 1.0, "stop_at_eos": False, "batch_size": len(rows)})
    inputs = [[1, 2, 3]] * len(rows)
    return decoding.decode_batch(None, inputs, {"hf_generate": ("hf_generate", {})}, config, 0, 4)["hf_generate"]


@pytest.mark.parametrize("path", [rows_decoded_by_the_loop, rows_decoded_by_transformers])
def test_rows_one_after_another_keep_their_own_times(monkeypatch, path):
    """Both ways of decoding a batch row after row time it by one rule: each row keeps its own decode
    time (its tokens/s is its prompt's alone), and the batch's is the sum of the rows' times."""
    from sparsespec.engine.generation import Generation, Round
    own = [1.0, 2.0, 4.0]
    rows = [Generation(tokens=[7] * (n + 1), prefill_s=0.1 * n, decode_s=s, method="x",
                       rounds=[Round(drafted=0, accepted=0, emitted=1, entropies=[], draft_s=0.0, verify_s=0.0)] * n)
            for n, s in zip((3, 5, 2), own)]
    gens = path(monkeypatch, rows)
    assert [g.decode_s for g in gens] == own                 # not counted from the batch's start
    assert gens.decode_s == pytest.approx(sum(own)) and gens.batch_size == 3
    assert gens.prefill_s == pytest.approx(0.1 * (3 + 5 + 2))
    assert gens.tokens_per_s == pytest.approx((3 + 5 + 2) / sum(own))


@pytest.mark.slow   # ~3 s
def test_methods_not_batched_decode_from_shared_prefills(references):
    """From one shared prefill per prompt (the harness's batch mode), as from their own prefills."""
    model, prompts, alone = references["llama"]
    methods = {case: ONE_AT_A_TIME[case] for case in ("quest", "sparsespec-static")}
    starts = [sparsespec.prefill(model, p, methods=methods, max_new_tokens=NEW) for p in prompts[1:]]
    for case in methods:
        shared = sparsespec.generate(model, prompts[1:], prefilled=[s.pop(case) for s in starts], stop_at_eos=False)
        assert [g.tokens for g in shared] == alone[1:], case


@torch.inference_mode()
def test_sampled_batch_not_batched_is_its_prompts_one_after_another(references):
    """Sampling: the batch draws from one random stream, sequence after sequence, so it emits
    exactly what its prompts decoded one after another from that stream emit."""
    model, prompts, _ = references["qwen2"]
    method, options = ONE_AT_A_TIME["oracle"]

    def sampler():
        return Sampler(temperature=1.0, generator=torch.Generator().manual_seed(11))

    def decode(rows, sampler):
        return [g.tokens for g in sparsespec.api.decode_prompts(
            model, rows, method=method, max_new_tokens=NEW, options=options, sampler=sampler, stop_ids=set())]
    together = decode(prompts[1:], sampler())
    stream = sampler()
    each = [decode([p], stream)[0] for p in prompts[1:]]
    assert together == each
    assert len({tuple(t) for t in together}) == len(together)     # the rows differ: not one draw repeated
    assert decode(prompts[1:2], sampler()) == together[:1]


def test_bad_batch_inputs_are_one_line_errors(references):
    model, prompts, _ = references["llama"]
    with pytest.raises(ConfigError, match="attention_mask shape"):
        sparsespec.generate(model, torch.ones(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 4),
                            method="ar", max_new_tokens=2)
    with pytest.raises(ConfigError, match="non-empty prompt"):     # an empty list is an empty prompt
        sparsespec.generate(model, [], method="ar", max_new_tokens=2)
    with pytest.raises(ConfigError, match="prompt 1 of the batch is empty"):
        sparsespec.generate(model, [prompts[0], torch.ones(0, dtype=torch.long)], method="ar", max_new_tokens=2)
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1] = 0
    with pytest.raises(ConfigError, match="attention_mask row 1 is all zeros: the mask leaves prompt 1 of the batch empty"):
        sparsespec.generate(model, torch.ones(2, 5, dtype=torch.long), attention_mask=mask, method="ar", max_new_tokens=2)
    assert isinstance(sparsespec.generate(model, [5, 6, 7], method="ar", max_new_tokens=2), sparsespec.Generation)


# --- sampling: the joint output of a batch is the product of the model's distributions, exactly ----

SAMPLED_NEW = 3             # tokens per sequence; VOCAB (3) is test_sampling's, whose helpers enumerate it


def joint_distribution(model, prompts, method, **options) -> dict[tuple, float]:
    """Exact distribution of the batch's outputs (tuple of each sequence's tokens), every branch of
    the batched loop's random choices enumerated (test_sampling.py's enumerating sampler)."""
    def decode_once(sampler) -> tuple:
        out = sparsespec.api.decode_prompts(model, [p.clone() for p in prompts], method=method,
                                               max_new_tokens=SAMPLED_NEW, sampler=sampler, stop_ids=set(),
                                               options=options)
        return tuple(tuple(g.tokens) for g in out)
    return enumerate_outputs(decode_once)


@pytest.mark.parametrize("method,options", slow_but("pld", [   # each case but pld ~10-35 s of CPU
    ("sparsespec", dict(controller="fixed", k=2, sink=1, recent=2, topk=2, draft_weights="full")),
    ("layerskip", dict(k=2, exit_layer=1, draft_weights="full")),
    ("pld", dict(k=2)),
    # a method that is not batchable decodes a batch one sequence at a time: its greedy path is checked
    # above (test_methods_not_batched_decode_a_batch_one_sequence_at_a_time) and its sampling per sequence
    # in test_sampling.py; enumerated here as a batch it cost ~27 s of the full suite
    ("ar", {})]))
@torch.inference_mode()
def test_batched_sampling_emits_exactly_the_model_distribution(method, options):
    model = build_tiny("llama", vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    prompts = [random_prompt(16, seed=2, vocab=VOCAB)[0], random_prompt(11, seed=3, vocab=VOCAB)[0]]
    a, b = (model_distribution(model, p, new=SAMPLED_NEW) for p in prompts)
    exact = {(x, y): a[x] * b[y] for x in a for y in b}
    dist = joint_distribution(model, prompts, method, **options)
    assert sum(dist.values()) == pytest.approx(1.0, abs=1e-9)
    assert total_variation(dist, exact) < 1e-4


# --- the harness: batch_size= --------------------------------------------------------------------

@pytest.mark.slow   # whole harness runs in-process
def test_harness_batch_size_compares_every_sequence_with_batched_ar(harness_run, tmp_path):
    import json
    run, model, prompts = harness_run
    summaries = run(tmp_path / "b", "batch_size=2", "bench.methods=['sparsespec_fixed:k=3,budget=0.3',streaming]")
    for entry, summary in summaries.items():
        assert summary["run"]["batch_size"] == 2
        metrics = summary["metrics"]
        assert metrics["batch_size"] == 2 and metrics["n_batches"] == 3 and metrics["batch_tokens_per_s"] > 0
        if entry != "ar":
            assert metrics["outputs_match_ar"] == 1.0          # every sequence compared, every one equal
            assert metrics["batch_speedup_vs_ar"] > 0
            assert metrics["batch_bound"] > 0 and metrics["batch_bound_reached"] > 0
        else:
            assert metrics["batch_bound"] is None
        # one prefill per prompt, shared by AR and both methods
        assert summary["run"]["prefill_shared"] and len(summary["run"]["prefill_shared_with"]) == 3
    folder = tmp_path / "b" / "sparsespec_fixed-k=3-budget=0.3"
    samples = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    assert [s["prompt_id"] for s in samples] == [f"p{i}" for i in range(5)]
    assert [s["batch_row"] for s in samples] == [0, 1, 0, 1, 0]
    assert all(s["outputs_match_ar"] is True for s in samples)
    alone = [sparsespec.generate(model, p.input_ids, method="ar", max_new_tokens=12, stop_at_eos=False).tokens
             for p in prompts]
    assert [s["text"] for s in samples] == [" ".join(map(str, t)) for t in alone]


@pytest.mark.slow   # whole harness runs in-process
def test_a_batched_entropy_controller_starts_from_a_cost_profile_measured_on_a_batch(harness_run, tmp_path,
                                                                                      monkeypatch):
    import sparsespec.harness.calibration as calibration
    from sparsespec.threads import thread_counts
    run, _, _ = harness_run
    profiled = []
    measure = calibration.measure_cost_profile

    def recording(model, inputs, **kwargs):
        profiled.append(inputs)
        return measure(model, inputs, **kwargs)
    monkeypatch.setattr(calibration, "measure_cost_profile", recording)
    summaries = run(tmp_path / "b", "batch_size=2", "num_prompts=3", "bench.methods=['sparsespec:budget=0.3']",
                    "cost_profile=true")
    # one profile a thread count compared (sparsespec/harness/thread_choice.py), each on a batch of 2
    assert len(profiled) == len(thread_counts()) and all(isinstance(p, list) and len(p) == 2 for p in profiled)
    summary = summaries["sparsespec:budget=0.3"]
    assert summary["run"]["cost_prior"]["verify_s"] and summary["metrics"]["outputs_match_ar"] == 1.0
    assert summaries["ar"]["run"]["cost_prior"] is None


@pytest.mark.slow   # a harness sweep in-process
def test_a_sweep_over_batch_sizes_prefills_each_prompt_once_with_prefill_memo(harness_run, tmp_path, monkeypatch,
                                                                               prefill_forwards):
    """prefill_memo_gb keeps the prompts' prefills from one run of the process to the next: the B=2
    run after the B=1 run runs no prefill forward, says so, and stays lossless."""
    import sparsespec.harness.decoding as decoding
    import sparsespec.engine.prefill as shared_prefill
    run, _, prompts = harness_run
    monkeypatch.setattr(decoding, "PREFILL_MEMO", shared_prefill.PrefillMemo())
    forwards = prefill_forwards
    common = ("num_prompts=4", "warmup=true", "cost_profile=false", "prefill_memo_gb=0.5",
              "bench.methods=['snapkv_static:k=3,budget=0.3']")
    first = run(tmp_path / "b1", "batch_size=1", *common)
    n = [len(p.input_ids) for p in prompts[:4]]
    assert forwards == [n[0], *n]              # the warm-up's prefill of prompt 1 is not kept, its own is
    second = run(tmp_path / "b2", "batch_size=2", *common)
    assert forwards[5:] == [n[0]] * 2                                  # B=2: the warm-up's only
    for entry in second:
        assert first[entry]["run"]["prefills_reused"] == 0
        assert second[entry]["run"]["prefills_reused"] == 4
    assert second["snapkv_static:k=3,budget=0.3"]["metrics"]["outputs_match_ar"] == 1.0
    run(tmp_path / "off", "batch_size=2", *common[:-2], "prefill_memo_gb=0", common[-1])
    assert len(forwards) == 7 + 2 + 4 and not decoding.PREFILL_MEMO.kept   # 0 GiB: nothing kept, all prefilled


@pytest.mark.slow   # a harness sweep in-process
def test_batch_analysis_reads_a_sweep_over_batch_sizes(harness_run, tmp_path):
    """analysis.batch over B = 1 and 2 runs of the harness: one row per (B, method) with the runs'
    own speed-ups and bounds, the cost split, the figure, and the document block replaced."""
    import json

    from analysis import batch as batch_analysis
    from analysis.load import load_results
    run, _, _ = harness_run
    with pytest.raises(SystemExit) as missing:                         # one line, no traceback
        batch_analysis.main([str(tmp_path / "none"), "--doc", "none"])
    assert missing.value.code == 2
    methods = "bench.methods=['sparsespec_fixed:k=3,budget=0.3']"
    for size in (1, 2):
        run(tmp_path / "sweep" / f"b{size}", f"batch_size={size}", "num_prompts=4", methods)
    with pytest.raises(SystemExit) as typo:                            # checked before anything is written
        batch_analysis.main([str(tmp_path / "sweep"), "--doc", str(tmp_path / "typo.md")])
    assert typo.value.code == 2 and not (tmp_path / "sweep" / "batch.md").exists()
    doc = tmp_path / "benchmark.md"
    doc.write_text(f"before\n{batch_analysis.MARK_BEGIN}\nold\n{batch_analysis.MARK_END}\nafter\n")
    assert batch_analysis.main([str(tmp_path / "sweep"), "--doc", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "old" not in text
    assert (tmp_path / "sweep" / "batch.md").is_file()
    assert (tmp_path / "sweep" / "figures" / "batch_scaling.png").stat().st_size > 0
    (tmp_path / "sweep" / "batch.md").unlink()
    assert batch_analysis.main([str(tmp_path / "sweep"), "--doc", "none"]) == 0     # the folder's files only
    assert (tmp_path / "sweep" / "batch.md").is_file() and doc.read_text() == text
    runs = batch_analysis.batch_runs(load_results(tmp_path / "sweep"))
    assert sorted(zip(runs["B"], runs["method"])) == [(1, "ar"), (1, "sparsespec_fixed k=3"),
                                                       (2, "ar"), (2, "sparsespec_fixed k=3")]
    for size in (1, 2):
        summary = json.loads((tmp_path / "sweep" / f"b{size}" / "sparsespec_fixed-k=3-budget=0.3" /
                              "summary.json").read_text())["metrics"]
        row = runs[(runs["B"] == size) & (runs["method"] != "ar")].iloc[0]
        lines = [json.loads(line) for line in (tmp_path / "sweep" / f"b{size}" / "sparsespec_fixed-k=3-budget=0.3" /
                                               "samples.jsonl").read_text().splitlines()]
        ratios = ([s["speedup_vs_ar"] for s in lines] if size == 1 else
                  [s["batch_speedup_vs_ar"] for s in lines if s["batch_row"] == 0])      # one ratio a batch
        assert row["speedup"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / len(ratios)))   # geometric
        assert row["bound"] == pytest.approx(summary["bound"] if size == 1 else summary["batch_bound"])
        assert row["n"] == (4 if size == 1 else 2)
    split = batch_analysis.cost_split(runs)
    assert list(split["sizes"]) == ["1,2"] and split["K_ar_ms"].notna().all()


def test_cost_split_recovers_per_step_and_per_sequence_costs():
    from analysis import batch as batch_analysis
    sizes = [1, 2, 4, 8]
    w, k = batch_analysis.fit_per_step_and_per_sequence(sizes, [5.0 + 3.0 * b for b in sizes])
    assert (w, k) == (pytest.approx(5.0), pytest.approx(3.0))
    assert all(math.isnan(x) for x in batch_analysis.fit_per_step_and_per_sequence([4, 4], [1.0, 2.0]))
    # AR step 10 + 4B ms, draft 2 + 0.5B, verify 12 + 5B; 3 tokens a round from 2 draft steps
    rows = [{"model": "m", "task": "t", "hardware": "h", "ctx": 8000, "method": "ar", "B": b,
             "ar_tokens_per_s": b / (10 + 4 * b) * 1e3} for b in sizes]
    rows += [{"model": "m", "task": "t", "hardware": "h", "ctx": 8000, "method": "s", "B": b,
              "ar_tokens_per_s": b / (10 + 4 * b) * 1e3, "c_draft_ms": 2 + 0.5 * b, "c_verify_ms": 12 + 5 * b,
              "tokens_per_round": 3.0, "draft_steps_per_round": 2.0, "speedup": 1.0, "bound": 1.1} for b in sizes]
    split = batch_analysis.cost_split(pd.DataFrame(rows)).iloc[0]
    assert (split["W_ar_ms"], split["K_ar_ms"]) == (pytest.approx(10), pytest.approx(4))
    assert (split["W_v_ms"], split["K_v_ms"]) == (pytest.approx(12), pytest.approx(5))
    assert split["large_batch_limit"] == pytest.approx(3 * 4 / (2 * 0.5 + 5))
    assert split["per_sequence_share_ar_at_max_B"] == pytest.approx(32 / 42)


@pytest.mark.slow   # a harness run, ~3 s
def test_harness_decodes_a_batch_of_a_method_that_cannot_batch_one_sequence_at_a_time(harness_run, tmp_path):
    run, _, _ = harness_run
    summary = run(tmp_path / "c", "batch_size=2", "method=quest", "num_prompts=3")
    samples = [json.loads(line) for line in (tmp_path / "c" / "samples.jsonl").read_text().splitlines()]
    assert summary["run"]["batch_size"] == 2 and summary["metrics"]["outputs_match_ar"] == 1.0
    assert [(s["batch_row"], s["batch_size"]) for s in samples] == [(0, 2), (1, 2), (0, 1)]   # the last batch holds one
    with pytest.raises(ConfigError, match="batch_size=0"):
        run(tmp_path / "d", "batch_size=0")


# --- lm-eval: --batch_size ------------------------------------------------------------------------

def test_lm_eval_model_generates_a_padded_batch_like_each_request_alone(references, monkeypatch):
    from sparsespec.lm_eval import model as lm_eval_model

    model, prompts, alone = references["qwen2"]
    stop = next(t for t in range(128) if all(t not in ref[:10] for ref in alone[1:4]))
    lm = object.__new__(lm_eval_model.SparseSpecLM)          # no HFLM loading: just the generation path
    lm.method, lm.method_options, lm._batch_generations = "sparsespec", dict(controller="fixed", k=3, **TINY_BUDGET), {}
    lm.generation_batch_size = 3
    lm.stop_token_ids = lambda: [stop]
    monkeypatch.setattr(lm_eval_model.SparseSpecLM, "model", property(lambda self: model))
    rows = prompts[1:4]                                       # 90, 200, 40 tokens, left-padded to 200
    width = max(p.numel() for p in rows)
    context = torch.full((3, width), 7, dtype=torch.long)
    mask = torch.zeros_like(context)
    for b, p in enumerate(rows):
        context[b, width - p.numel():], mask[b, width - p.numel():] = p, 1
    out = lm._model_generate(context, max_length=width + 10, stop=[], attention_mask=mask, do_sample=False)
    assert out.shape[0] == 3 and torch.equal(out[:, :width], context)
    for b, ref in enumerate(alone[1:4]):
        new = out[b, width:].tolist()
        assert new[:10] == ref[:10]
        assert [g.tokens for g in lm._batch_generations[tuple(rows[b].tolist())]] == [ref[:10]]


@pytest.mark.slow   # composes and resolves every cell of the experiment
def test_bench_batch_experiment_cells_are_valid(tmp_path):
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from sparsespec.harness.checks import check_config
    from sparsespec.harness.run_config import build_run_config

    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=bench_batch_cpu"], return_hydra_config=True)
        params = cfg.hydra.sweeper.params
        assert str(params.batch_size).split(",") == ["1", "2", "4", "8"]
        for ctx in str(params.ctx).split(","):
            for size in str(params.batch_size).split(","):
                cell = compose("config", overrides=["experiment=bench_batch_cpu", f"ctx={ctx}", f"batch_size={size}"])
                check_config(cell)
                assert cell.num_prompts % int(size) == 0
                build_run_config(cell, tmp_path)


def test_batched_sampling_is_reproducible_with_a_seed(references):
    model, prompts, _ = references["qwen2"]
    # a clock-driven choice (the fallback) changes which draws a round makes: reproducible runs need a
    # controller that decides from the tokens alone
    runs = [sparsespec.generate(model, prompts[:3], method="sparsespec", temperature=0.8, top_p=0.9, seed=5,
                                max_new_tokens=16, stop_at_eos=False, recent=8, budget=30, fallback=False)
            for _ in range(2)]
    assert [g.tokens for g in runs[0]] == [g.tokens for g in runs[1]]
    assert len({tuple(g.tokens) for g in runs[0]}) == 3
