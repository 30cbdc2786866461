"""The typed run config (sparsespec/harness/run_config.py) and the one decode loop of the harness."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from sparsespec.errors import ConfigError
from sparsespec.harness import entries
from sparsespec.harness import run_config as run_config_module
from sparsespec.harness.run_config import build_run_config

CONF = Path(__file__).resolve().parents[1] / "conf"

# A sample of a batch_size 1 run, field by field as docs/CONTRACTS.md lists them, plus its place in
# the prompt's run order and the code that decoded it. Batch fields (batch_size, batch_row, ...) belong to batch_size > 1 only.
SINGLE_SAMPLE_KEYS = sorted([
    "prompt_id", "model", "task", "source", "method", "ctx", "context_tokens", "new_tokens", "prefill_s",
    "decode_s", "tokens_per_s", "mean_accepted", "acceptance_rate", "time_split", "rounds", "ar_tokens_per_s",
    "ar_decode_s", "ar_prefill_s", "speedup_vs_ar", "outputs_match_ar", "text", "reference", "score", "depth",
    "run_position", "code", "code_dirty", "cpu", "cpu_capability", "gpu"])


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=["logger=none", *overrides])


def test_the_run_config_is_frozen_and_typed(tmp_path):
    config = build_run_config(composed("ctx=1k", "bench.methods=['sparsespec_fixed:k=4',hf_pld]"), tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.batch_size = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.methods[0].options = {}
    assert [m.entry for m in config.methods] == ["ar", "sparsespec_fixed:k=4", "hf_pld"]
    fixed = config.methods[1]
    assert (fixed.name, fixed.label, fixed.options["k"], fixed.folder) == \
        ("sparsespec", "sparsespec_fixed", 4, tmp_path / "sparsespec_fixed-k=4")
    assert fixed.resolved["controller"] == "fixed" and fixed.config["method"]["label"] == "sparsespec_fixed"
    assert config.methods[2].is_reference and not fixed.is_reference
    assert (config.ctx, config.batch_size, config.bench, config.device in ("cpu", "cuda")) == (1000, 1, True, True)


@pytest.mark.parametrize("override,line", [
    ("top_p=2", "top_p=2 must be a number in (0, 1]"),
    ("batch_size=0", "batch_size=0 must be an integer >= 1"),
    ("run_order=shuffled", "run_order='shuffled' is unknown; accepted: random, fixed"),
])
def test_a_bad_value_is_one_config_error_line_while_building(override, line, tmp_path):
    with pytest.raises(ConfigError) as err:
        build_run_config(composed(override), tmp_path)
    assert str(err.value) == line


def test_a_bad_bench_entry_stops_the_build(tmp_path):
    with pytest.raises(ConfigError, match="bench.methods entry 'streaming:bogus=1'|bogus") as err:
        build_run_config(composed("bench.methods=['streaming:bogus=1']"), tmp_path)
    assert "\n" not in str(err.value)


@pytest.mark.slow   # a whole benchmark, ~3 s: `make test`
def test_bench_entries_are_composed_at_build_and_never_later(harness_run, tmp_path, monkeypatch):
    """Every `bench.methods` entry is turned into its method once, while the run config is built."""
    run, _, _ = harness_run
    composes, at_build = [], []
    compose_method = entries.compose
    build = run_config_module.build_run_config

    def spying_compose(*args, **kwargs):
        composes.append(kwargs.get("overrides"))
        return compose_method(*args, **kwargs)

    def recording_build(*args, **kwargs):
        config = build(*args, **kwargs)
        at_build.append(len(composes))
        return config
    monkeypatch.setattr(entries, "compose", spying_compose)
    monkeypatch.setattr("sparsespec.harness.runner.build_run_config", recording_build)
    run(tmp_path / "cell", "num_prompts=2", "max_new_tokens=4", "warmup=true", "cost_profile=false",
        "bench.methods=['sparsespec_fixed:k=2,budget=0.3',pld]")
    assert at_build == [3] and len(composes) == 3          # ar, sparsespec_fixed, pld: at build only


@pytest.mark.slow   # a whole harness run, ~3 s: `make test`
def test_a_batch_of_one_keeps_the_sample_fields_it_always_had(harness_run, tmp_path):
    run, _, _ = harness_run
    run(tmp_path / "cell", "num_prompts=2", "max_new_tokens=4", "warmup=false", "cost_profile=false",
        "bench.methods=['sparsespec_fixed:k=2,budget=0.3']")
    for folder in ("ar", "sparsespec_fixed-k=2-budget=0.3"):
        lines = (tmp_path / "cell" / folder / "samples.jsonl").read_text().splitlines()
        assert len(lines) == 2
        for line in lines:
            assert sorted(json.loads(line)) == SINGLE_SAMPLE_KEYS


@pytest.mark.slow   # a batched harness run
def test_a_reference_decoder_decodes_a_batch_one_prompt_at_a_time(harness_run, tmp_path):
    """hf_generate with batch_size=2: each row decoded alone, each sample its own throughput and the
    batch's; the batch's throughput is the rows' decode tokens over their summed decode time."""
    run, _, _ = harness_run
    summaries = run(tmp_path / "cell", "batch_size=2", "num_prompts=3", "max_new_tokens=6", "warmup=true",
                    "cost_profile=false", "bench.methods=[hf_generate]")
    assert summaries["hf_generate"]["run"]["batch_size"] == 2
    samples = [json.loads(line) for line in (tmp_path / "cell" / "hf_generate" / "samples.jsonl").read_text().splitlines()]
    assert [(s["prompt_id"], s["batch_row"], s["batch_size"]) for s in samples] == [("p0", 0, 2), ("p1", 1, 2),
                                                                                    ("p2", 0, 1)]
    assert all(s["outputs_match_ar"] for s in samples)      # greedy: transformers' AR equals ours
    first_batch = samples[:2]
    decode_s = sum(s["decode_s"] for s in first_batch)
    tokens = sum(s["tokens_per_s"] * s["decode_s"] for s in first_batch)
    for s in first_batch:
        assert s["batch_decode_s"] == pytest.approx(decode_s)
        assert s["batch_tokens_per_s"] == pytest.approx(tokens / decode_s)
        assert s["batch_speedup_vs_ar"] == pytest.approx(s["batch_tokens_per_s"] / s["ar_batch_tokens_per_s"])
