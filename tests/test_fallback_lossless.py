"""Runs that switch between plain AR steps and speculation, forced by injected costs, emit exactly
what plain decoding emits: greedy token for token (one sequence and a batch, three architectures),
and sampling in distribution (exact enumeration)."""
from __future__ import annotations

import pytest
import torch

import sparsespec
from conftest import ARCHS, build_tiny, random_prompt
from sparsespec.calibration import CostProfile
from sparsespec.controllers import EntropyController
from sparsespec.controllers.fallback import PLAIN
from sparsespec.api import decode, sparsespec_attention
from sparsespec.method_options import resolve
from sparsespec.methods import METHODS
from helpers import NEW as SAMPLED, TOLERANCE, enumerate_outputs, model_distribution, total_variation

NEW = 48
SWITCHING = dict(cost_window=3, probe_every=1, probe_max=2)   # short memory and waits: many switches in 48 tokens
MID_BUDGET = dict(sink=4, recent=16, budget=0.2)


class InjectedCosts(EntropyController):
    """The entropy controller fed scripted seconds instead of the clock's: phases of `phase` rounds
    alternate quiet (a speculative round far cheaper per token than AR's 0.01 s) and loaded (far
    dearer), quiet first unless `loaded_first`, so the fallback rule switches in and out of plain
    decoding."""

    def __init__(self, phase: int, loaded_first: bool = False, **options):
        super().__init__(**options)
        self.phase, self.offset = phase, int(loaded_first)

    def observe_batch(self, entropies, accepted, submitted, draft_step_s, verify_s, round_s=None) -> None:
        loaded = (self.rounds_seen // self.phase + self.offset) % 2 == 1
        if submitted == 0:
            verify_s = 0.01                                    # A = 100 tokens/s
        else:   # quiet: >= 1 token in <= 16 * 1e-4 + 2e-3 s (> 270/s); loaded: <= 17 tokens in > 1 s
            draft_step_s, verify_s = (0.01, 1.0) if loaded else (1e-4, 2e-3)
        round_s = submitted * (draft_step_s or 0.0) + verify_s
        super().observe_batch(entropies, accepted, submitted, draft_step_s, verify_s, round_s)


def injected(method: str, options: dict, phase: int, loaded_first: bool = False) -> InjectedCosts:
    return InjectedCosts(phase, loaded_first, **resolve(method, options).controller_options.as_dict())


def switches(gen) -> int:
    """How often consecutive chosen rounds change between plain decoding and speculation."""
    plain = [r.choice in PLAIN for r in gen.rounds if r.choice]
    return sum(a != b for a, b in zip(plain, plain[1:]))


def assert_switching_run(gen, ar_tokens):
    assert gen.tokens == ar_tokens
    assert 1 + sum(r.emitted for r in gen.rounds) == len(gen.tokens)
    plain = [r for r in gen.rounds if r.choice in PLAIN]
    assert plain and all(r.drafted == 0 and r.draft_steps == 0 and r.emitted == 1 for r in plain)
    assert {r.choice for r in gen.rounds} >= {"ar_probe", "fallback", "probe", "speculate"}
    assert switches(gen) >= 4, [r.choice for r in gen.rounds]


@pytest.fixture(scope="module")
def references():
    out = {}
    for arch in ARCHS:
        model = build_tiny(arch)
        prompts = [random_prompt(300, seed=s) for s in (1, 2, 3)]
        ar = [sparsespec.generate(model, p, method="ar", max_new_tokens=NEW, stop_at_eos=False).tokens
              for p in prompts]
        out[arch] = (model, prompts, ar)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_switching_run_is_token_identical_to_ar(references, arch):
    model, prompts, ar = references[arch]
    options = dict(controller="entropy", warmup_rounds=1, **SWITCHING, **MID_BUDGET)
    start = sparsespec.prefill(model, prompts[0], methods={"s": ("sparsespec", options)}, max_new_tokens=NEW)["s"]
    start.controller = injected("sparsespec", options, phase=4)
    gen = sparsespec.generate(model, prompts[0], prefilled=start, stop_at_eos=False)
    assert_switching_run(gen, ar[0])
    assert any(r.accepted < r.drafted for r in gen.rounds)        # rejections too, or the test proves little


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_switching_batch_is_token_identical_to_each_prompt_alone(references, arch):
    model, prompts, ar = references[arch]
    options = dict(controller="entropy", warmup_rounds=1, **SWITCHING, **MID_BUDGET)
    starts = [sparsespec.prefill(model, p, methods={"s": ("sparsespec", options)}, max_new_tokens=NEW)["s"]
              for p in prompts]
    starts[0].controller = injected("sparsespec", options, phase=4)   # the batch's one controller
    gens = sparsespec.generate(model, prompts, prefilled=starts, stop_at_eos=False)
    for gen, tokens in zip(gens, ar):
        assert gen.tokens == tokens
    assert_switching_run(gens[0], ar[0])
    for i in range(min(len(g.rounds) for g in gens)):                  # one choice per round for the batch
        assert len({(g.rounds[i].drafted, g.rounds[i].choice) for g in gens}) == 1


SAMPLED_OPTIONS = dict(controller="entropy", candidates=(1, 2), prior_k=2, warmup_k=(2,), cost_window=1,
                       probe_every=1, probe_max=1, sink=1, recent=2, topk=2, draft_weights="full")


@pytest.mark.slow   # ~8 s an architecture; the greedy switches stay in the fast tier
@pytest.mark.parametrize("arch", ARCHS)
def test_sampling_through_plain_and_speculative_rounds_emits_the_model_distribution(arch):
    """C_AR already measured and costs loaded: the first round speculates and loses, and where it
    left room a plain round follows; the exact output distribution of the first tokens is the model's."""
    model = build_tiny(arch, vocab_size=3, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    prompt = random_prompt(16, seed=2, vocab=3)
    resolved = resolve("sparsespec", SAMPLED_OPTIONS)
    choices = []

    @torch.inference_mode()
    def decode_once(sampler) -> tuple:
        controller = injected("sparsespec", SAMPLED_OPTIONS, phase=100, loaded_first=True)
        controller.use_cost_prior(CostProfile(draft_step_s=1e-4, verify_s={1: 2e-3, 2: 2e-3}))
        controller.plain.observe("", 0, 1.0, 0.01)                  # C_AR measured: A = 100 tokens/s
        drafter = METHODS["sparsespec"](model, prompt_len=prompt.numel(), max_new_tokens=SAMPLED,
                                        max_k=controller.max_k, options=resolved.drafter_options)
        with sparsespec_attention(model):
            gen = decode(model, prompt.view(-1), drafter, controller, sampler, SAMPLED, set())
        choices.append([r.choice for r in gen.rounds])
        return tuple(gen.tokens)

    dist = enumerate_outputs(decode_once)
    with torch.inference_mode():
        exact = model_distribution(model, prompt)
    assert total_variation(dist, exact) < TOLERANCE
    assert all(c[0] == "speculate" for c in choices)
    assert any(c[:2] == ["speculate", "fallback"] for c in choices)   # where a draft was rejected


class RecordingRounds(EntropyController):
    """The entropy controller, recording the whole-round seconds the loop gives it."""

    def __init__(self, **options):
        super().__init__(**options)
        self.round_s = []

    def observe_batch(self, entropies, accepted, submitted, draft_step_s, verify_s, round_s=None) -> None:
        self.round_s.append(round_s)
        super().observe_batch(entropies, accepted, submitted, draft_step_s, verify_s, round_s)


def test_the_loop_gives_the_controller_each_whole_rounds_seconds(references):
    model, prompts, _ = references["llama"]
    options = dict(controller="entropy", warmup_rounds=1, **MID_BUDGET)
    start = sparsespec.prefill(model, prompts[0], methods={"s": ("sparsespec", options)}, max_new_tokens=16)["s"]
    start.controller = RecordingRounds(**resolve("sparsespec", options).controller_options.as_dict())
    gen = sparsespec.generate(model, prompts[0], prefilled=start, stop_at_eos=False)
    assert any(r.select_s > 0 and r.draft_steps > 0 for r in gen.rounds)
    assert start.controller.round_s == [pytest.approx(r.select_s + r.draft_s + r.verify_s) for r in gen.rounds]


@pytest.mark.parametrize("ar_step_s,first", [(1e-3, "speculate"), (None, "ar_probe")])
def test_a_profile_with_c_ar_opens_a_prompt_speculating_and_stays_lossless(references, ar_step_s, first):
    model, prompts, ar = references["qwen2"]
    options = dict(controller="entropy", **MID_BUDGET)
    prior = CostProfile(draft_step_s=1e-3, verify_s={1: 5e-3, 2: 6e-3}, ar_step_s=ar_step_s)
    start = sparsespec.prefill(model, prompts[1], methods={"s": ("sparsespec", options)}, max_new_tokens=NEW)["s"]
    gen = sparsespec.generate(model, prompts[1], prefilled=start, cost_prior=prior, stop_at_eos=False)
    assert gen.rounds[0].choice == first and gen.tokens == ar[1]
