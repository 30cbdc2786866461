"""Threads chosen by measurement (sparsespec/harness/thread_choice.py) and the cost profile sized to the run
(sparsespec/harness/calibration.py): the rules, and the choice reaching the decoders, on a tiny model."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import sparsespec
from conftest import build_tiny, random_prompt
from sparsespec import threads
from sparsespec.calibration import DEFAULT_KS, MIN_AR_STEPS, PLAIN_ROUNDS, CostProfile, cycle_tokens, profile_cycle
from sparsespec.engine.attention import AR_ATTENTION
from sparsespec.harness import environment, thread_choice
from sparsespec.harness.calibration import (FLOOR_KS, PROFILE_SHARE, RunCalibration, has_thread_probe, measure_planned,
                                            plan_profiles, probe_groups, profile_size, reads_costs)
from sparsespec.harness.report import busy_line, threads_line


def profile(draft_step_s: float, verify_s: dict[int, float]) -> CostProfile:
    return CostProfile(draft_step_s=draft_step_s, verify_s=verify_s)


def test_thread_counts_are_one_and_the_default():
    assert threads.thread_counts(4) == (1, 4)
    assert threads.thread_counts(1) == (1,)


def test_using_sets_the_count_and_restores_it_even_after_an_error():
    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    with threads.using(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), threads.using(other):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == before
    with threads.using(None):
        assert torch.get_num_threads() == before


def test_the_cheaper_count_is_chosen_and_a_tie_goes_to_fewer_threads():
    assert thread_choice.choose({1: 0.03, 2: 0.02}, "C_AR").threads == 2
    assert thread_choice.choose({1: 0.02, 2: 0.03}, "C_AR").threads == 1
    assert thread_choice.choose({2: 0.02, 1: 0.02}, "C_AR").threads == 1
    assert thread_choice.choose({1: 0.02, 2: 0.03}, "C_AR").as_dict()["cost_s"] == {"1": 0.02, "2": 0.03}


def test_speculation_is_compared_on_one_round_at_each_profiled_k():
    # W = (1 * 0.01 + 0.05) + (4 * 0.01 + 0.08)
    assert thread_choice.profile_work_s(profile(0.01, {1: 0.05, 4: 0.08})) == pytest.approx(0.18)


def test_a_mixed_plan_pays_only_when_it_beats_both_counts_by_more_than_its_switches():
    # drafting is faster at 2 threads, verification at 1 (as beside a busy core)
    by_count = {1: profile(0.010, {1: 0.05, 4: 0.08}), 2: profile(0.006, {1: 0.09, 4: 0.20})}
    cheap = thread_choice.mixed_plan(by_count, switch_s=1e-5)
    assert (cheap["draft_threads"], cheap["verify_threads"]) == (2, 1)
    # W(mixed) = (0.006 + 0.05) + (0.024 + 0.08) + 4 switches; W(1) = 0.18
    assert cheap["work_s"] == pytest.approx(0.16 + 4e-5) and cheap["pays"] is True
    assert thread_choice.mixed_plan(by_count, switch_s=0.01)["pays"] is False
    same = {1: profile(0.010, {1: 0.05}), 2: profile(0.020, {1: 0.09})}
    assert thread_choice.mixed_plan(same, switch_s=0.0) is None
    assert thread_choice.mixed_plan({1: by_count[1]}, switch_s=None) is None


def test_a_switch_cost_is_measured_and_leaves_the_count_as_it_was():
    before = torch.get_num_threads()
    cost = threads.switch_cost_s((1, 2), repeats=20)
    assert math.isfinite(cost) and cost >= 0
    assert torch.get_num_threads() == before


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: a CPU\nflags\t\t: fpu sse avx2 avx512f\n")
    assert environment.cpu_flags(cpuinfo) == {"avx2": True, "avx512": True, "amx": False}
    cpuinfo.write_text("model name\t: a CPU without flags\n")
    assert environment.cpu_flags(cpuinfo) == {"avx2": None, "avx512": None, "amx": None}
    assert environment.cpu_flags(tmp_path / "missing") == {"avx2": None, "avx512": None, "amx": None}


def test_the_machine_record_names_the_blas_and_the_default_count():
    facts = environment.machine()
    assert f"BLAS_INFO={facts['blas']}" in torch.__config__.show()
    assert facts["default_threads"] == threads.DEFAULT_THREADS >= 1
    assert set(facts["cpu_flags"]) == {"avx2", "avx512", "amx"}


# --------------------------------------------------------------------------------------------
# the profile sized to the run


def test_a_smoke_run_profiles_the_floor_only():
    # 2 prompts x 16 tokens: a budget of 8 tokens, one cycle of k = 1, 2 (6 tokens)
    assert profile_size(16, 2) == (FLOOR_KS, 1)
    assert cycle_tokens(FLOOR_KS, 1) < cycle_tokens(DEFAULT_KS, 2) / 10


def test_a_long_run_keeps_the_full_two_cycle_profile():
    assert profile_size(128, 4) == (DEFAULT_KS, 2)     # 128 tokens of budget, 99 needed
    assert profile_size(128, 2) == (DEFAULT_KS, 1)     # 64: one cycle (50 tokens)


def test_no_k_the_run_cannot_draft_is_profiled():
    ks, repeats = profile_size(8, 100)
    assert ks == tuple(k for k in DEFAULT_KS if k < 8) and repeats == 2


@pytest.mark.parametrize("max_new_tokens", [1, 2, 16, 40, 64, 128, 512])
@pytest.mark.parametrize("num_prompts", [1, 2, 4, 10])
def test_the_profile_stays_within_its_share_of_the_run_or_at_the_floor(max_new_tokens, num_prompts):
    ks, repeats = profile_size(max_new_tokens, num_prompts)
    budget = PROFILE_SHARE * max_new_tokens * num_prompts
    assert cycle_tokens(ks, repeats) <= budget or (ks, repeats) == (FLOOR_KS, 1)
    assert set(FLOOR_KS) <= set(ks) and repeats in (1, 2)


def test_a_smoke_run_plans_ar_steps_at_every_count_and_path_then_a_probe_and_nothing_more():
    jobs = plan_profiles({"sparsespec": ("sparsespec", {"budget": 0.5})}, ar=True, max_new_tokens=16,
                         num_prompts=2, counts=(1, 2))
    ar_jobs = [(("ar",), t, path) for t in (1, 2) for path in AR_ATTENTION]
    assert [(j.entries, j.threads, j.ar_attention) for j in jobs.values()] == ar_jobs + [
        (("sparsespec",), 1, None), (("sparsespec",), 2, None)]
    probe = [j for j in jobs.values() if j.entries == ("sparsespec",)][0]
    assert probe.options["ks"] == profile_cycle(FLOOR_KS) and probe.length == cycle_tokens(profile_cycle(FLOOR_KS), 1)
    assert all(j.length == MIN_AR_STEPS + 1 for j in jobs.values() if j.entries == ("ar",))


def test_a_long_run_adds_the_sized_profile_once_at_the_chosen_count():
    jobs = plan_profiles({"sparsespec": ("sparsespec", {})}, ar=False, max_new_tokens=128, num_prompts=4, counts=(1, 2))
    assert [(j.entries, j.threads, j.priors) for j in jobs.values()] == [(("sparsespec",), t, ("sparsespec",))
                                                                          for t in (1, 2, None)]
    sized = list(jobs.values())[-1]
    assert sized.options["ks"] == profile_cycle(DEFAULT_KS) and sized.length == cycle_tokens(profile_cycle(DEFAULT_KS), 2)


def test_a_method_that_ignores_costs_gets_thread_probes_as_itself_and_no_cost_profile():
    jobs = plan_profiles({"fixed": ("sparsespec", {"controller": "fixed", "k": 4}), "pld": ("pld", {})},
                         ar=True, max_new_tokens=128, num_prompts=4, counts=(1, 2))
    assert [(j.entries, j.threads, j.costs) for j in jobs.values()] == [
        (("ar",), t, False) for t in (1, 2) for _ in AR_ATTENTION] + [
        (("fixed",), 1, False), (("fixed",), 2, False), (("pld",), 1, False), (("pld",), 2, False)]
    fixed = next(j for j in jobs.values() if j.entries == ("fixed",))
    assert fixed.options == {"controller": "fixed", "k": 4} and fixed.length == cycle_tokens(FLOOR_KS, 1)


ONE_DRAFTER = {"sparsespec": ("sparsespec", {"budget": 0.5}),                          # the entropy controller
               "sparsespec_fixed:k=4": ("sparsespec", {"budget": 0.5, "controller": "fixed", "k": 4}),
               "other budget": ("sparsespec", {"budget": 0.3, "controller": "fixed", "k": 4}),
               "pld": ("pld", {})}


def test_entries_of_one_drafter_share_a_probe_and_one_sized_profile_whatever_their_controllers():
    assert probe_groups(ONE_DRAFTER) == [("sparsespec", "sparsespec_fixed:k=4"), ("other budget",), ("pld",)]
    jobs = plan_profiles(ONE_DRAFTER, ar=False, max_new_tokens=128, num_prompts=4, counts=(1, 2))
    shared = ("sparsespec", "sparsespec_fixed:k=4")
    assert [(j.entries, j.threads, j.priors) for j in jobs.values()] == [
        (shared, 1, ("sparsespec",)), (shared, 2, ("sparsespec",)), (("other budget",), 1, ()),
        (("other budget",), 2, ()), (("pld",), 1, ()), (("pld",), 2, ()), (shared, None, ("sparsespec",))]
    probe = next(iter(jobs.values()))       # the entropy entry's cost profile floor: it needs a prior
    assert probe.costs and probe.options["controller"] == "cycle" and probe.options["budget"] == 0.5
    # the same drafter options spelled out or left to their defaults are the same drafter
    default = {"budget": sparsespec.method_options.resolve("sparsespec", {}).drafter_options.as_dict()["budget"]}
    assert len(probe_groups({"a": ("sparsespec", {}), "b": ("sparsespec", {"controller": "fixed", **default})})) == 1


def test_entries_sharing_a_probe_get_one_choice_from_one_probe_and_only_the_cost_reader_a_prior(monkeypatch):
    """Stubbed timers: each probe's cost depends on the count it runs at, and the calls are counted."""
    import sparsespec.harness.calibration as calibration_module
    probed = []

    def cost_profile_at_this_count(model, prompts, prefilled, ar_attention):
        probed.append(torch.get_num_threads())
        return profile(0.01, {1: 0.05, 2: 0.06} if torch.get_num_threads() == 2 else {1: 0.5, 2: 0.6})

    def decoded_at_this_count(model, prompts, prefilled, stop_at_eos, ar_attention, threads, remember):
        assert threads == torch.get_num_threads()                 # measured at the count it runs at, not chosen
        assert remember is False                                  # the probe is its own evidence
        probed.append(torch.get_num_threads())
        return SimpleNamespace(decode_s=0.1 if torch.get_num_threads() == 1 else 1.0)
    monkeypatch.setattr(calibration_module, "measure_cost_profile", cost_profile_at_this_count)
    monkeypatch.setattr(calibration_module, "generate", decoded_at_this_count)
    monkeypatch.setattr(threads, "switch_cost_s", lambda counts: 0.0)
    jobs = plan_profiles(ONE_DRAFTER, ar=False, max_new_tokens=16, num_prompts=2, counts=(1, 2))  # the floor only
    starts = [{label: object() for label in jobs}]
    calibration = RunCalibration()
    measure_planned(None, [random_prompt(10)], starts, jobs, calibration)
    assert not starts[0] and sorted(probed) == [1, 1, 1, 2, 2, 2]           # 3 probes at each count, not 4
    shared = calibration.choices["sparsespec"]
    assert calibration.choices["sparsespec_fixed:k=4"] is shared and shared.threads == 2
    assert shared.as_dict()["probe_shared_by"] == ["sparsespec", "sparsespec_fixed:k=4"]
    assert calibration.get("sparsespec").verify_s == {1: 0.05, 2: 0.06} and calibration.get("sparsespec_fixed:k=4") is None
    for entry in ("other budget", "pld"):
        assert calibration.choices[entry].threads == 1 and calibration.choices[entry].probe_shared_by == (entry,)


def test_every_drafting_method_is_probed_and_only_the_entropy_controller_reads_costs():
    assert all(has_thread_probe(m) for m in ("sparsespec", "pld", "streaming", "layerskip", "oracle"))
    assert not has_thread_probe("ar") and not has_thread_probe("no such method")
    assert reads_costs("sparsespec", {}) and not reads_costs("sparsespec", {"controller": "fixed"})


def test_every_profile_cycle_ends_with_plain_rounds_that_time_c_ar():
    assert profile_cycle((1, 2)) == (1, 2) + (0,) * PLAIN_ROUNDS
    assert 1 + PLAIN_ROUNDS >= MIN_AR_STEPS                  # with the profile's last token's round


def test_c_ar_is_the_median_whole_round_without_a_draft():
    from sparsespec.calibration import profile_of
    from sparsespec.engine.generation import Round
    spec = Round(drafted=2, accepted=1, emitted=2, entropies=[0.1, 0.2], draft_s=0.02, verify_s=0.05, select_s=0.01,
                 draft_steps=2)
    plain = [Round(drafted=0, accepted=0, emitted=1, entropies=[], draft_s=0.0, verify_s=v, select_s=0.0) for v in
             (0.04, 0.03, 0.9)]                                  # one slow step: ignored by the median
    assert profile_of([spec, *plain]).ar_step_s == 0.04
    assert profile_of([spec]).ar_step_s is None


def test_an_entry_with_a_thread_choice_alone_counts_as_calibrated():
    calibration = RunCalibration(choices={"fixed": thread_choice.ThreadChoice(1, {1: 0.1, 2: 0.2}, "decode")})
    assert "fixed" in calibration and calibration.get("fixed") is None and "other" not in calibration


# --------------------------------------------------------------------------------------------
# on a tiny model


@pytest.fixture(scope="module")
def tiny():
    return build_tiny("llama")


def measured(tiny, prompt, jobs, monkeypatch=None) -> RunCalibration:
    starts = sparsespec.prefill(tiny, prompt, methods={label: (j.method, j.options) for label, j in jobs.items()},
                                lengths={label: j.length for label, j in jobs.items()})
    calibration = RunCalibration()
    measure_planned(tiny, [prompt], [starts], jobs, calibration)
    assert not starts                                                # every start decoded once
    return calibration


@pytest.mark.slow   # profiles a tiny model at two thread counts
def test_the_sized_profile_is_measured_at_the_count_the_probes_chose(tiny, monkeypatch):
    import sparsespec.harness.calibration as calibration_module
    at = []
    measure = calibration_module.measure_cost_profile

    def recording(model, inputs, **kwargs):
        profile = measure(model, inputs, **kwargs)
        at.append((torch.get_num_threads(), tuple(profile.verify_s)))
        return profile
    monkeypatch.setattr(calibration_module, "measure_cost_profile", recording)
    jobs = plan_profiles({"sparsespec": ("sparsespec", {"budget": 0.5})}, ar=False, max_new_tokens=20,
                         num_prompts=4, counts=(1, 2))
    calibration = measured(tiny, random_prompt(200), jobs)
    chosen = calibration.choices["sparsespec"].threads
    ks, _ = profile_size(20, 4)                                      # (1, 2, 4, 8) once: 20 tokens
    # a round whose k would pass the profile's length drafts fewer: measured too (k = 6 of 8 here)
    assert [(t, set(FLOOR_KS) <= set(v), set(ks) <= set(v)) for t, v in at] == [(1, True, False), (2, True, False),
                                                                                (chosen, True, True)]
    assert set(calibration.get("sparsespec").verify_s) == set(at[-1][1])


@pytest.mark.slow   # profiles a tiny model at two thread counts
def test_measured_choices_are_recorded_with_the_prior_of_the_chosen_count(tiny):
    prompt = random_prompt(200)
    jobs = plan_profiles({"sparsespec": ("sparsespec", {"budget": 0.5})}, ar=True, max_new_tokens=16,
                         num_prompts=2, counts=(1, 2))
    starts = sparsespec.prefill(tiny, prompt, methods={label: (j.method, j.options) for label, j in jobs.items()},
                                lengths={label: j.length for label, j in jobs.items()})
    before = torch.get_num_threads()
    calibration = RunCalibration()
    measure_planned(tiny, [prompt], [starts], jobs, calibration)
    assert torch.get_num_threads() == before and not starts          # every start decoded once
    spec, ar = calibration.choices["sparsespec"], calibration.choices["ar"]
    assert set(spec.cost_s) == set(ar.cost_s) == {1, 2}
    assert spec.threads == min(spec.cost_s, key=spec.cost_s.get) and ar.threads == min(ar.cost_s, key=ar.cost_s.get)
    assert set(calibration.get("sparsespec").verify_s) == set(FLOOR_KS)
    assert thread_choice.profile_work_s(calibration.get("sparsespec")) == spec.cost_s[spec.threads]
    assert calibration.get("sparsespec").ar_step_s > 0                              # its own k = 0 rounds: C_AR
    assert spec.mixed is None or spec.mixed["switch_s"] >= 0
    assert calibration.threads_for("ar (reference)", "ar") == ar.threads
    assert calibration.threads_for("sparsespec", "sparsespec") == spec.threads
    assert calibration.threads_for("pld", "pld") is None


@pytest.mark.slow   # decodes a tiny model at two thread counts
def test_a_fixed_k_method_and_pld_get_a_thread_choice_from_their_own_decodes_and_no_prior(tiny):
    jobs = plan_profiles({"fixed": ("sparsespec", {"budget": 0.5, "controller": "fixed", "k": 2}), "pld": ("pld", {})},
                         ar=False, max_new_tokens=64, num_prompts=4, counts=(1, 2))
    calibration = measured(tiny, random_prompt(200), jobs)            # pld may find nothing to propose
    for entry in ("fixed", "pld"):
        choice = calibration.choices[entry]
        assert set(choice.cost_s) == {1, 2} and choice.threads == min(choice.cost_s, key=choice.cost_s.get)
        assert calibration.get(entry) is None and entry in calibration


@pytest.mark.parametrize("online", [False, True])
def test_each_decoder_decodes_at_its_chosen_count(tiny, online):
    """The probe's count: the whole generation's (online_threads=false), or where the online rule starts
    and holds for its first wait (true); a decoder with no probe keeps the process's count, or explores."""
    from omegaconf import OmegaConf

    from sparsespec.harness import decoding
    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    calibration = RunCalibration(choices={"ar": thread_choice.ThreadChoice(other, {other: 0.0}, "C_AR")})
    cfg = OmegaConf.create({"temperature": 0.0, "top_p": 1.0, "stop_at_eos": False, "batch_size": 1,
                            "online_threads": online})
    decoders = {"ar (reference)": ("ar", {}), "sparsespec": ("sparsespec", {"budget": 0.5})}
    gens = decoding.decode_batch(tiny, [random_prompt(200)], decoders, cfg, 0, 6, calibration)
    assert {r.threads for r in gens["ar (reference)"][0].rounds} == {other}
    spec_counts = {r.threads for r in gens["sparsespec"][0].rounds}
    assert spec_counts == ({1, before} if online and before > 1 else {before})
    assert gens["sparsespec"][0].tokens == gens["ar (reference)"][0].tokens
    assert torch.get_num_threads() == before


# --------------------------------------------------------------------------------------------
# the result table


def test_the_table_says_when_the_machine_was_busy():
    line = busy_line({"cpu_busy_before": 0.4, "cpu_busy_after": 0.1, "noisy": True})
    assert "40%/10%" in line and "busy" in line
    assert busy_line({"cpu_busy_before": 0.01, "cpu_busy_after": 0.02, "noisy": False}) is None
    assert busy_line(None) is None


def test_the_table_names_the_chosen_threads():
    choice = thread_choice.choose({1: 0.012, 2: 0.020}, "C_AR").as_dict()
    assert threads_line(choice) == "threads: 1 (measured C_AR: 1 -> 12.0 ms, 2 -> 20.0 ms)"
    assert threads_line(None) is None


def test_the_run_takes_the_fastest_ar_path_at_the_chosen_thread_count_and_records_every_variant():
    calibration = RunCalibration()
    measured = {(1, "packed_sdpa"): 0.30, (1, "packed_matmul"): 0.32, (1, "sdpa"): 0.50,
                (2, "packed_sdpa"): 0.21, (2, "packed_matmul"): 0.20, (2, "sdpa"): 0.40}
    calibration.choose_ar(measured)
    assert calibration.choices["ar"].threads == 2 and calibration.choices["ar"].cost_s == {1: 0.30, 2: 0.20}
    assert calibration.ar_attention == "packed_matmul"         # fastest at 2 threads, though not at 1
    recorded = calibration.ar_variants()
    assert recorded["ar_attention"] == "packed_matmul" and recorded["threads"] == 2
    assert recorded["ar_step_s"]["sdpa"] == {"1": 0.50, "2": 0.40}
    assert RunCalibration().ar_variants() is None               # nothing measured: nothing claimed
