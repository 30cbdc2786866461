"""The side-by-side benchmark as a mode of the harness (`bench.methods`): one runner, one result
format. In-process on a tiny model (the model and prompt loading are replaced); the last test runs
`python run.py experiment=bench_cpu` on the embedded SmolLM2."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

import sparsespec.harness.decoding as decoding
import sparsespec.harness.runner as runner
from analysis.figures import main as figures_main
from helpers import Tokenizer
from conftest import build_tiny, random_prompt, slow_but
from sparsespec.errors import ConfigError
from sparsespec.harness.entries import entry_folder, method_node
from sparsespec.harness.plan import REFERENCE
from sparsespec.harness.results import aggregate
from sparsespec.harness.run_config import build_run_config, method_specs
from sparsespec.threads import thread_counts

REPO = Path(__file__).resolve().parents[1]
BUDGET = "budget=0.5"        # 150 of the tiny prompts' 300 tokens: room for sink + recent
METHODS = [f"sparsespec:{BUDGET}", f"sparsespec_fixed:k=4,{BUDGET}", "pld", "hf_generate", "hf_pld"]
FOLDERS = ["ar", "sparsespec-budget=0.5", "sparsespec_fixed-k=4-budget=0.5", "pld", "hf_generate", "hf_pld"]



def tiny_prompts(n: int) -> list:
    prompts = []
    for i in range(n):
        ids = random_prompt(300, seed=i)[0]
        ids[200:260] = ids[100:160]                      # something for prompt lookup to find
        prompts.append(SimpleNamespace(id=f"p{i}", input_ids=ids, reference=None))
    return prompts


@pytest.fixture(scope="module")
def tiny_llama():
    return build_tiny("llama")


@pytest.fixture
def bench(monkeypatch, tiny_llama):
    """Run the harness in-process on the tiny model; returns (run, calls), calls being the
    decoders each prompt was decoded with."""
    monkeypatch.setattr(runner, "load_inputs", lambda cfg: (tiny_llama, Tokenizer(), tiny_prompts(cfg.num_prompts)))
    calls = []
    decode_batch = decoding.decode_batch

    def recording(model, inputs, decoders, config, seed, max_new_tokens, cost_priors=None, profiles=None):
        calls.append((len(inputs[0]), seed, list(decoders)))
        return decode_batch(model, inputs, decoders, config, seed, max_new_tokens, cost_priors, profiles)
    monkeypatch.setattr(decoding, "decode_batch", recording)

    def run(folder: Path, *overrides: str) -> dict:
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose("config", overrides=["logger=none", "ctx=1k", "num_prompts=2", "max_new_tokens=10",
                                               "warmup=false", f"bench.methods=[{','.join(repr(m) for m in METHODS)}]",
                                               *overrides])
            return runner.run(cfg, folder)
    return run, calls


def read(folder: Path) -> tuple[dict, list[dict]]:
    return (json.loads((folder / "summary.json").read_text()),
            [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()])


@pytest.mark.slow   # a whole benchmark run in-process
def test_every_method_gets_the_folder_and_files_of_a_run(bench, tmp_path):
    run, calls = bench
    summaries = run(tmp_path / "cell")
    assert sorted(p.name for p in (tmp_path / "cell").iterdir() if p.is_dir()) == sorted(FOLDERS)
    assert list(summaries) == ["ar", *METHODS]
    # one decode call per prompt, every method in it
    assert [sorted(c[2]) for c in calls] == [sorted(["ar", *METHODS])] * 2   # each its own order: test_run_order.py
    for folder in FOLDERS:
        summary, samples = read(tmp_path / "cell" / folder)
        assert summary["metrics"] == json.loads(json.dumps(aggregate(samples)))   # the aggregation of any run
        assert [s["prompt_id"] for s in samples] == ["p0", "p1"]
        assert summary["run"]["output_dir"] == str(tmp_path / "cell" / folder)
        assert summary["config"]["method"]["label"] == summary["run"]["method"] == samples[0]["method"]
        if folder != "ar":
            assert all(s["outputs_match_ar"] for s in samples), folder      # greedy fp32: lossless, HF too
            assert summary["run"]["prefill_shared"] is not folder.startswith("hf_")
    ar_summary, ar_samples = read(tmp_path / "cell" / "ar")
    assert ar_summary["metrics"]["speedup_vs_ar"] == 1.0
    fixed = read(tmp_path / "cell" / "sparsespec_fixed-k=4-budget=0.5")[0]
    assert fixed["run"]["method_options"]["k"] == 4 and fixed["run"]["method_options"]["budget"] == 0.5
    assert fixed["run"]["bench"]["methods"] == ["ar", *METHODS]
    # every method's sample divides by the same AR decode of its prompt
    for folder in FOLDERS[1:]:
        samples = read(tmp_path / "cell" / folder)[1]
        assert [s["ar_decode_s"] for s in samples] == [s["decode_s"] for s in ar_samples]
    assert read(tmp_path / "cell" / "hf_pld")[0]["run"]["method_options"]["prompt_lookup_num_tokens"] == 10
    # the entropy controller starts from a cost profile measured on the first prompt; fixed k needs none
    # sized to the run (2 prompts x 10 tokens): the floor of k = 1, 2
    prior = read(tmp_path / "cell" / "sparsespec-budget=0.5")[0]["run"]["cost_prior"]
    assert prior["draft_step_s"] > 0 and set(prior["verify_s"]) == {"1", "2"}
    assert fixed["run"]["cost_prior"] is None
    # AR, the entropy controller and fixed k decode at a measured thread count, recorded with the CPU it suits
    spec = read(tmp_path / "cell" / "sparsespec-budget=0.5")[0]
    for measured in (spec, ar_summary, fixed):
        assert measured["run"]["threads"]["threads"] in thread_counts()
        assert set(measured["run"]["threads"]["cost_s"]) == {str(t) for t in thread_counts()}
    # one drafter with the same options: the entropy and the fixed-k entries share one probe and its count
    assert spec["run"]["threads"] == fixed["run"]["threads"]
    assert spec["run"]["threads"]["probe_shared_by"] == METHODS[:2]
    assert spec["env"]["blas"] and set(spec["env"]["cpu_flags"]) == {"avx2", "avx512", "amx"}
    assert set(spec["run"]["load"]) == {"cpu_busy_before", "cpu_busy_after", "noisy"}


@pytest.mark.slow   # a whole benchmark run in-process
def test_the_cost_profile_decodes_from_the_first_prompts_shared_prefill(bench, tmp_path, prefill_forwards):
    """One prefill a prompt, the profile included: it used to prefill the first prompt a second time
    (9 min a task at 32K on Qwen here)."""
    run, _ = bench
    prefills = prefill_forwards
    summaries = run(tmp_path / "cell", "bench.methods=['sparsespec:budget=0.5','sparsespec_fixed:k=4']")
    assert prefills == [300, 300]                                        # tiny_prompts(2): one each
    prior = summaries["sparsespec:budget=0.5"]["run"]["cost_prior"]
    assert prior["draft_step_s"] > 0 and set(prior["verify_s"]) == {"1", "2"}   # sized to 2 x 10 tokens
    assert prior["ar_step_s"] > 0                              # C_AR from the profile's k = 0 rounds
    assert summaries["sparsespec_fixed:k=4"]["run"]["cost_prior"] is None
    assert summaries["sparsespec:budget=0.5"]["metrics"]["outputs_match_ar"] == 1.0


@pytest.mark.slow   # three whole benchmark runs (~14 s)
def test_a_benchmark_resumes_per_method_without_redoing_finished_prompts(bench, tmp_path, capsys):
    run, calls = bench
    cell = tmp_path / "cell"
    run(cell, "cost_profile=false")       # the profile is tested above; here it only costs time
    killed = cell / "pld" / "samples.jsonl"                 # as if killed after pld's first prompt
    killed.write_text(killed.read_text().splitlines(keepends=True)[0])
    before = {f: (cell / f / "samples.jsonl").read_text() for f in FOLDERS if f != "pld"}
    calls.clear()
    capsys.readouterr()
    run(cell, "cost_profile=false")
    bar = capsys.readouterr().err
    assert "| 1/2 [" in bar and "| 0/2 [" not in bar       # the bar starts at the prompt every method kept
    # prompt p1 only: AR as reference, and pld
    assert [(n, seed, sorted(d)) for n, seed, d in calls] == [(300, 1, sorted([REFERENCE, "pld"]))]
    assert all((cell / f / "samples.jsonl").read_text() == text for f, text in before.items())
    summary, samples = read(cell / "pld")
    assert [s["prompt_id"] for s in samples] == ["p0", "p1"] and summary["metrics"]["n_prompts"] == 2
    assert summary["run"]["resumed"] is True
    calls.clear()
    run(cell, "num_prompts=3", "cost_profile=false")           # more prompts: only the new one, every method
    assert [sorted(c[2]) for c in calls] == [sorted(["ar", *METHODS])]


def test_method_entries_take_options_and_are_checked(tmp_path):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        node = method_node("sparsespec_fixed:k=8,recent=32,draft_weights=full")
        assert (node.name, node.label, node.options.k, node.options.recent, node.options.draft_weights) == \
            ("sparsespec", "sparsespec_fixed recent=32,draft_weights=full", 8, 32, "full")
        assert method_node("hf_pld:prompt_lookup_num_tokens=5").options.prompt_lookup_num_tokens == 5
        cfg = compose("config", overrides=["bench.methods=['streaming:bogus=1']"])
        with pytest.raises(ConfigError, match="bogus"):
            build_run_config(cfg, tmp_path)
        cfg = compose("config", overrides=["bench.methods=['hf_generate:colour=2']"])
        with pytest.raises(ConfigError, match="colour"):
            build_run_config(cfg, tmp_path)
    assert entry_folder("sparsespec_fixed:k=4,recent=128") == "sparsespec_fixed-k=4-recent=128"


@pytest.mark.slow   # a whole benchmark, ~3.5 s: `make test`
def test_entries_that_resolve_alike_are_decoded_once_into_one_folder(bench, tmp_path, capsys):
    """`sparsespec:budget=0.5,` is `sparsespec:budget=0.5` again, and `sparsespec_fixed:budget=0.5`
    is `sparsespec:controller=fixed,budget=0.5`: each pair is one entry, one folder, one sample a prompt."""
    run, calls = bench
    summaries = run(tmp_path / "cell", "cost_profile=false", "bench.methods=['sparsespec:budget=0.5',"
                    "'sparsespec:budget=0.5,','sparsespec_fixed:budget=0.5','sparsespec:controller=fixed,budget=0.5']")
    kept = ["ar", "sparsespec:budget=0.5", "sparsespec_fixed:budget=0.5"]
    assert list(summaries) == kept and [sorted(c[2]) for c in calls] == [sorted(kept)] * 2   # run order is shuffled
    assert sorted(p.name for p in (tmp_path / "cell").iterdir() if p.is_dir()) == \
        ["ar", "sparsespec-budget=0.5", "sparsespec_fixed-budget=0.5"]
    for folder in ("sparsespec-budget=0.5", "sparsespec_fixed-budget=0.5"):
        assert [s["prompt_id"] for s in read(tmp_path / "cell" / folder)[1]] == ["p0", "p1"]
    said = [line for line in capsys.readouterr().err.splitlines() if "decoded once" in line]
    assert len(said) == 2 and "'sparsespec:budget=0.5,' is 'sparsespec:budget=0.5' again" in said[0]


def test_different_entries_never_share_a_folder(tmp_path):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["bench.methods=['assisted:draft_model=truncated:1',"
                                           "'assisted:draft_model=truncated/1']"])
        with pytest.raises(ConfigError, match="differ but would share the folder .*assisted-draft_model=truncated-1"):
            build_run_config(cfg, tmp_path)


@pytest.mark.parametrize("entry,names", [("sparsespc", "unknown method 'sparsespc'.*accepted: .*sparsespec_fixed"),
                                         ("hf_pld:max_matching_ngram", "'max_matching_ngram' must be option=value"),
                                         ("streaming:=4", "'=4' must be option=value")])
def test_a_bad_method_entry_is_one_line_naming_it(entry, names):
    with pytest.raises(ConfigError, match=names) as error:
        method_node(entry)
    assert "\n" not in str(error.value) and entry in str(error.value)


@pytest.mark.parametrize("name", slow_but("matrix_cpu", ["bench_cpu", "bench_cpu_qwen", "bench_gpu", "matrix_cpu",
                                                        "bench_batch_cpu"]))   # the others ~2-8 s each
def test_bench_experiments_list_methods_that_run_at_their_contexts(name, tmp_path):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={name}"], return_hydra_config=True)
        contexts = str(cfg.hydra.sweeper.params.ctx).split(",")
        assert str(cfg.hydra.mode) == "RunMode.MULTIRUN" and cfg.bench.methods
        for ctx in contexts:
            cell = compose("config", overrides=[f"experiment={name}", f"ctx={ctx}"])
            specs = method_specs(cell, tmp_path)            # the methods alone: a cell's model is the sweep's
            assert [s.entry for s in specs][0] == "ar" and len(specs) == len(set(cfg.bench.methods) | {"ar"})


@pytest.mark.slow
@pytest.mark.real_model
def test_bench_experiment_runs_and_analysis_reads_it(tmp_path, cli_here):
    """`python run.py experiment=bench_cpu` (run in this process), cut to one 1K context, one prompt and
    8 tokens, then `python -m analysis.figures` on its sweep folder."""
    sweep = tmp_path / "multirun"
    done = cli_here(REPO, "experiment=bench_cpu", "hydra.sweeper.params.ctx=1k", "num_prompts=1", "max_new_tokens=8",
                    "bench.methods=[sparsespec,'sparsespec_fixed:k=4',hf_generate]", f"hydra.sweep.dir={sweep}")
    assert done.returncode == 0, done.stderr[-3000:]
    cell = next(sweep.glob("0_smollm2_135m_summarization_ctx1000_bench"))
    assert sorted(p.name for p in cell.iterdir() if (p / "summary.json").exists()) == \
        ["ar", "hf_generate", "sparsespec", "sparsespec_fixed-k=4"]
    assert "speed-up (geo. mean, 95% CI)" in done.stdout
    out = tmp_path / "figures"
    assert figures_main([str(sweep), "--out", str(out), "--no-progress"]) == 0
    table = pd.read_csv(out / "method_comparison.csv")
    assert sorted(table["method"]) == ["ar", "hf_generate", "sparsespec", "sparsespec_fixed k=4"]
    ours = json.loads((cell / "sparsespec" / "summary.json").read_text())["metrics"]
    assert table.set_index("method").loc["sparsespec", "speedup"] == pytest.approx(ours["speedup_vs_ar"])
    assert table.set_index("method").loc["hf_generate", "outputs_match_ar"] == 1.0


def test_an_entry_with_options_other_than_k_and_budget_gets_its_own_label():
    """Two entries of one method must not share a label, or analysis/ pools their samples."""
    assert method_node("sparsespec").label == "sparsespec"
    assert method_node("sparsespec_fixed:k=4").label == "sparsespec_fixed"          # analysis adds "k=4"
    paper = method_node("sparsespec:acceptance_model=paper,budget=0.05")
    assert paper.label == "sparsespec acceptance_model=paper" and paper.name == "sparsespec"
    assert paper.options.acceptance_model == "paper" and paper.options.budget == 0.05
