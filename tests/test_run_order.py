"""The order in which a run's methods decode each prompt (`run_order`, sparsespec/harness/order.py):
a permutation drawn from the run's seed and the prompt's index, the one actually used recorded per
sample (`run_position`), reproduced by a resume; `fixed` keeps AR, then the listed order."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

import sparsespec.harness.decoding as decoding
from analysis.load import load_results
from sparsespec.errors import ConfigError
from sparsespec.harness.checks import check_config
from sparsespec.harness.order import prompt_order
from sparsespec.harness.plan import REFERENCE

REPO = Path(__file__).resolve().parents[1]
ENTRIES = ["ar", "sparsespec", "sparsespec_fixed:k=4", "streaming", "pld", "hf_generate"]
METHODS = ["pld", "sparsespec_fixed:k=3,budget=0.3"]          # cheap on the tiny model
FOLDERS = {"ar": "ar", "pld": "pld", "sparsespec_fixed:k=3,budget=0.3": "sparsespec_fixed-k=3-budget=0.3"}


# --------------------------------------------------------------------------------------------
# the rule


def test_each_prompts_order_is_a_permutation_of_the_entries():
    for index in range(20):
        assert sorted(prompt_order(ENTRIES, 0, index, "random")) == sorted(ENTRIES)


def test_the_order_differs_across_prompts_so_no_entry_is_always_first_or_last():
    orders = [prompt_order(ENTRIES, 0, index, "random") for index in range(30)]
    assert len({tuple(o) for o in orders}) > 1
    assert len({o[0] for o in orders}) > 1 and len({o[-1] for o in orders}) > 1


def test_the_order_is_reproduced_from_the_seed_and_the_prompt_index():
    for seed in (0, 7, -3):
        assert [prompt_order(ENTRIES, seed, i, "random") for i in range(10)] == \
               [prompt_order(list(ENTRIES), seed, i, "random") for i in range(10)]
    # another seed draws other orders
    assert [prompt_order(ENTRIES, 0, i, "random") for i in range(10)] != \
           [prompt_order(ENTRIES, 1, i, "random") for i in range(10)]


def test_fixed_keeps_the_listed_order():
    assert all(prompt_order(ENTRIES, 0, index, "fixed") == ENTRIES for index in range(10))


def compose_run(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=["logger=none", *overrides])


def test_random_is_the_default_and_a_bad_value_is_one_line_naming_it():
    assert compose_run().run_order == "random"
    with pytest.raises(ConfigError) as err:
        check_config(compose_run("run_order=shuffled"))
    assert str(err.value) == "run_order='shuffled' is unknown; accepted: random, fixed"


# --------------------------------------------------------------------------------------------
# the harness on the tiny model


@pytest.fixture
def decoded(harness_run, monkeypatch):
    """(run, calls): the tiny-model harness and, per decode call, (seed, the decoders in the order given)."""
    run, _, _ = harness_run
    calls = []

    def recording(original):
        def decode(model, inputs, decoders, cfg, seed, *args, **kwargs):
            calls.append((seed, list(decoders)))
            return original(model, inputs, decoders, cfg, seed, *args, **kwargs)
        return decode
    monkeypatch.setattr(decoding, "decode_batch", recording(decoding.decode_batch))

    def bench(folder: Path, *overrides: str) -> dict:
        return run(folder, "warmup=false", "cost_profile=false", f"bench.methods=[{','.join(map(repr, METHODS))}]",
                   *overrides)
    return bench, calls


def samples_of(cell: Path) -> dict[str, list[dict]]:
    return {entry: [json.loads(line) for line in (cell / folder / "samples.jsonl").read_text().splitlines()]
            for entry, folder in FOLDERS.items()}


def positions(samples: dict[str, list[dict]], row: int) -> list[str]:
    """The entries in the order their samples of prompt `row` say they decoded."""
    return sorted(samples, key=lambda entry: samples[entry][row]["run_position"])


@pytest.mark.slow   # a whole benchmark, ~3.5 s: `make test`
def test_a_benchmark_decodes_each_prompt_in_its_drawn_order_and_records_it(decoded, tmp_path):
    run, calls = decoded
    run(tmp_path / "cell")
    entries = ["ar", *METHODS]
    assert [seed for seed, _ in calls] == [0, 1, 2, 3, 4]          # one call a prompt
    assert [order for _, order in calls] == [prompt_order(entries, 0, i, "random") for i in range(5)]
    assert len({tuple(order) for _, order in calls}) > 1
    samples = samples_of(tmp_path / "cell")
    assert [positions(samples, row) for row in range(5)] == [order for _, order in calls]
    assert all(sorted(s[row]["run_position"] for s in samples.values()) == [0, 1, 2] for row in range(5))
    assert all(s["outputs_match_ar"] for entry in METHODS for s in samples[entry])   # still lossless
    frame = load_results(tmp_path / "cell")                      # analysis reads the column
    assert sorted(zip(frame["method"], frame["prompt_id"], frame["run_position"])) == \
           sorted((s["method"], s["prompt_id"], s["run_position"]) for rows in samples.values() for s in rows)


@pytest.mark.slow   # a harness run; the random order stays in the fast tier
def test_fixed_decodes_ar_then_the_listed_methods(decoded, tmp_path):
    run, calls = decoded
    run(tmp_path / "cell", "run_order=fixed", "num_prompts=2")
    assert [order for _, order in calls] == [["ar", *METHODS]] * 2
    samples = samples_of(tmp_path / "cell")
    assert [positions(samples, row) for row in range(2)] == [["ar", *METHODS]] * 2


@pytest.mark.slow   # two harness sittings
def test_a_resume_decodes_what_is_left_in_the_first_sittings_order_and_adds_each_sample_once(decoded, tmp_path):
    run, calls = decoded
    unbroken = [prompt_order(["ar", *METHODS], 0, i, "random") for i in range(4)]   # what an unbroken run decodes
    cell = tmp_path / "cell"
    run(cell, "num_prompts=3")
    assert [order for _, order in calls] == unbroken[:3]
    killed = cell / "ar" / "samples.jsonl"                       # as if killed before AR's last prompt
    killed.write_text("".join(killed.read_text().splitlines(keepends=True)[:2]))
    calls.clear()
    run(cell, "num_prompts=4")                                  # the resume, and one more prompt
    assert calls == [(2, ["ar"]), (3, unbroken[3])]             # only AR was left of prompt 2
    samples = samples_of(cell)
    assert all([s["prompt_id"] for s in samples[entry]] == ["p0", "p1", "p2", "p3"] for entry in FOLDERS)
    assert [positions(samples, row) for row in (0, 1, 3)] == [unbroken[0], unbroken[1], unbroken[3]]
    assert samples["ar"][2]["run_position"] == 0                 # decoded alone this time


@pytest.mark.slow   # two harness sittings
def test_a_resume_with_an_unrecorded_ar_reference_gives_it_ars_place(decoded, tmp_path):
    run, calls = decoded
    entries = ["ar", *METHODS]
    # a seed whose prompt 1 decodes pld before AR, so the reference's place is not first by chance
    seed = next(s for s in range(100) if prompt_order(entries, s, 1, "random").index("pld")
                < prompt_order(entries, s, 1, "random").index("ar"))
    cell = tmp_path / "cell"
    run(cell, "num_prompts=2", f"seed={seed}")
    order = calls[1][1]
    killed = cell / "pld" / "samples.jsonl"                       # pld lost its last prompt
    killed.write_text(killed.read_text().splitlines(keepends=True)[0])
    calls.clear()
    run(cell, "num_prompts=2", f"seed={seed}")
    assert calls == [(seed + 1, ["pld", REFERENCE])] and order.index("pld") < order.index("ar")
    resumed = samples_of(cell)["pld"]
    assert [s["prompt_id"] for s in resumed] == ["p0", "p1"]
    assert resumed[1]["run_position"] == 0


@pytest.mark.slow   # a batched harness run
def test_a_batched_run_draws_one_order_a_batch(decoded, tmp_path):
    run, calls = decoded
    run(tmp_path / "cell", "batch_size=2")
    entries = ["ar", *METHODS]
    assert calls == [(first, prompt_order(entries, 0, first, "random")) for first in (0, 2, 4)]
    samples = samples_of(tmp_path / "cell")
    for row, first in enumerate([0, 0, 2, 2, 4]):                 # each prompt's batch starts at `first`
        assert positions(samples, row) == prompt_order(entries, 0, first, "random")


def test_the_progress_bar_follows_sparsespec_not_the_method_that_runs_last():
    from types import SimpleNamespace as Run
    matrix = [Run(label="ar", method="ar"), Run(label="sparsespec", method="sparsespec"),
              Run(label="streaming", method="sparse_kv"), Run(label="assisted", method="assisted")]
    assert decoding.shown_run(matrix).label == "sparsespec"
    assert decoding.shown_run([matrix[0], matrix[3]]).label == "assisted"      # no SparseSpec-L: the first other
    assert decoding.shown_run(matrix[:1]).label == "ar"
    sample = {"tokens_per_s": 12.34, "speedup_vs_ar": 1.456}
    assert decoding.progress_text(sample, "sparsespec") == "sparsespec 12.3 tok/s, 1.46x"
    assert decoding.progress_text({"tokens_per_s": 9.0, "speedup_vs_ar": None}, None) == "9.0 tok/s"
