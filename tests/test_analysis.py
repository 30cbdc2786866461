"""Tests of analysis/ (loading, figures, tables, W&B mapping, notebook) on result folders that follow
docs/CONTRACTS.md, built here with random but internally consistent numbers, plus (when the harness
runs) one tiny real sweep."""
from __future__ import annotations

import json
import math
import os
import random
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from analysis import paper
from analysis.figures import main as figures_main
from analysis.load import COLUMNS, load_results, load_wandb, rows_from_wandb_run, frame_from_rows
from analysis.metrics import auc, predicted_ratio, roc_curve
from analysis.plots import FIGURES
from analysis.tables import measured_costs, method_comparison, paper_vs_measured
from conftest import run_py_here, slow_but
from helpers import log_scale_interval
from sparsespec.harness.results import aggregate

REPO = Path(__file__).resolve().parents[1]
MODEL, TASK, CPU = "smollm2_135m", "summarization", "Synthetic CPU @ 2.0GHz"


# ---------------------------------------------------------------- synthetic results (the contract)

def method_config(method: str, options: dict) -> dict:
    base = {"controller": "fixed" if method == "sparsespec_fixed" else "entropy" if method == "sparsespec" else None,
            "k": None, "budget": None}
    return {"name": "sparsespec" if method.startswith("sparsespec") else method, "label": method,
            "options": {**base, **options} if method.startswith("sparsespec") else dict(options)}


def synthetic_rounds(rng: random.Random, method: str, k: int | None, n_decode: int, t_ar: float) -> list[dict]:
    """Rounds whose acceptance depends on entropy (low entropy -> likely accepted), until n_decode tokens."""
    rounds, left = [], n_decode
    c_d, c_v = 0.3 * t_ar, 1.1 * t_ar
    while left > 0:
        if method == "ar":
            rounds.append({"drafted": 0, "accepted": 0, "emitted": 1, "entropies": [], "draft_s": 0.0,
                           "verify_s": t_ar, "select_s": 0.0, "draft_steps": 0, "accept_probs": [],
                           "survival": [], "cost_draft": None, "cost_verify": None})
            left -= 1
            continue
        drafted = k or rng.randint(2, 14)
        entropies = [rng.uniform(0.0, 4.0) for _ in range(drafted)]
        accepted = 0
        while accepted < drafted and rng.random() < 1 / (1 + math.exp(1.5 * (entropies[accepted] - 1.8))):
            accepted += 1
        emitted = min(accepted + 1, left)
        controlled = method == "sparsespec"
        probs = [1 / (1 + math.exp(h - 1.8)) for h in entropies] if controlled else []
        rounds.append({"drafted": drafted, "accepted": accepted, "emitted": emitted, "entropies": entropies,
                       "draft_s": drafted * c_d * rng.uniform(0.9, 1.1), "verify_s": c_v * rng.uniform(0.9, 1.1),
                       "select_s": 0.0005, "draft_steps": drafted, "accept_probs": probs,
                       "survival": list(np.cumprod(probs)) if controlled else [],
                       "cost_draft": c_d if controlled else None, "cost_verify": c_v if controlled else None})
        left -= emitted
    return rounds


def synthetic_sample(rng: random.Random, method: str, ctx: int, k: int | None, prompt: int,
                     new_tokens: int = 24) -> dict:
    t_ar = 0.01 * (1 + ctx / 2048) * rng.uniform(0.95, 1.05)
    rounds = synthetic_rounds(rng, method, k, new_tokens - 1, t_ar)
    decode_s = sum(r["draft_s"] + r["verify_s"] + r["select_s"] for r in rounds) + 0.001
    decode_tokens = sum(r["emitted"] for r in rounds)
    ar_decode_s = None if method == "ar" else decode_tokens * t_ar * rng.uniform(0.95, 1.05)
    drafted = sum(r["drafted"] for r in rounds)
    tps = decode_tokens / decode_s
    ar_tps = None if ar_decode_s is None else decode_tokens / ar_decode_s
    return {"prompt_id": f"p{prompt}", "model": MODEL, "task": TASK, "source": "embedded", "method": method,
            "ctx": ctx, "context_tokens": ctx - 7, "new_tokens": new_tokens, "prefill_s": ctx * 1e-4,
            "decode_s": decode_s, "tokens_per_s": tps, "mean_accepted": decode_tokens / len(rounds),
            "acceptance_rate": sum(r["accepted"] for r in rounds) / drafted if drafted else 0.0,
            "time_split": {"prefill": ctx * 1e-4, "draft": sum(r["draft_s"] for r in rounds),
                           "verify": sum(r["verify_s"] for r in rounds),
                           "select": sum(r["select_s"] for r in rounds), "other": 0.001},
            "rounds": rounds, "ar_tokens_per_s": ar_tps, "ar_decode_s": ar_decode_s,
            "ar_prefill_s": None if method == "ar" else ctx * 1e-4,
            "speedup_vs_ar": None if ar_tps is None else tps / ar_tps,
            "outputs_match_ar": None if method == "ar" else True, "text": "lorem", "reference": None,
            "score": None}


def real_env() -> dict:
    """summary.json's `env` exactly as sparsespec/harness/environment.py writes it, on a named CPU."""
    from sparsespec.harness.environment import collect
    return {**collect(device="cpu", dtype="float32"), "cpu": CPU, "gpu": None}


def write_run(run_dir: Path, method: str, ctx: int, experiment: str | None = None, seed: int = 0,
              n_prompts: int = 3, **options) -> Path:
    """One run folder exactly as run.py writes it: samples.jsonl, summary.json, .hydra/*.yaml."""
    rng = random.Random(f"{method}-{ctx}-{options}-{seed}")
    samples = [synthetic_sample(rng, method, ctx, options.get("k"), i) for i in range(n_prompts)]
    config = {"model": {"name": MODEL, "embedded": True}, "task": {"name": TASK, "source": "embedded"},
              "ctx": ctx, "method": method_config(method, options), "logger": {"name": "none"}, "seed": seed,
              "num_prompts": n_prompts, "max_new_tokens": 24, "temperature": 0.0, "dtype": "float32",
              "device": "cpu"}
    wall_s = sum(s["prefill_s"] + s["decode_s"] for s in samples) + 5
    summary = {"run": {"model": MODEL, "task": TASK, "source": "embedded", "method": method, "ctx": ctx,
                       "seed": seed, "dtype": "float32", "device": "cpu", "temperature": 0.0,
                       "started": "2026-11-29T12:00:00+00:00",
                       "finished": f"2026-11-29T12:{int(wall_s) // 60:02d}:{int(wall_s) % 60:02d}+00:00"},
               "metrics": aggregate(samples), "config": config, "env": ENV}
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (run_dir / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(
        {"hydra": {"runtime": {"choices": {"experiment": experiment, "method": method}}}}))
    return run_dir


def write_sweep(root: Path, experiment: str, jobs: list[dict]) -> list[Path]:
    """A Hydra multirun folder: root/<date>/<time>/<job>_.../ per job."""
    sweep = root / "2026-11-29" / f"12-00-{len(list(root.glob('*/*'))):02d}"
    return [write_run(sweep / f"{i}_{job['method']}", experiment=experiment, **job) for i, job in enumerate(jobs)]


ENV = real_env()
CONTEXTS = [1000, 2000, 4000]
SPEEDUP_METHODS = ["ar", "sparsespec", "streaming", "pld"]
KS = [4, 8, 12, 16, 20]
BUDGETS = [0.02, 0.05, 0.1, 0.2]


def build_results_tree(root: Path) -> Path:
    write_sweep(root, "speedup_vs_context_cpu", [{"method": m, "ctx": c} for c in CONTEXTS for m in SPEEDUP_METHODS])
    write_sweep(root, "fixed_k_ablation_cpu", [{"method": "sparsespec_fixed", "ctx": 2000, "k": k} for k in KS])
    write_sweep(root, "budget_ablation_cpu", [{"method": "sparsespec", "ctx": 2000, "budget": b} for b in BUDGETS])
    return root


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    return build_results_tree(tmp_path_factory.mktemp("multirun"))


@pytest.fixture(scope="module")
def frame(results) -> pd.DataFrame:
    return load_results(results)


@pytest.fixture(scope="module")
def figures_out(results, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("figures")
    assert figures_main([str(results), "--out", str(out), "--no-progress"]) == 0
    return out


# ---------------------------------------------------------------- loader

def test_single_run_folder_gives_one_row_per_prompt(tmp_path):
    run_dir = write_run(tmp_path / "outputs" / "run", "sparsespec", 2000, n_prompts=2)
    df = load_results(run_dir)
    lines = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert list(df.columns) == list(COLUMNS)
    assert sorted(df["prompt_id"]) == sorted(s["prompt_id"] for s in lines)
    row = df.set_index("prompt_id").loc[lines[1]["prompt_id"]]
    assert row["tokens_per_s"] == pytest.approx(lines[1]["tokens_per_s"])
    assert row["n_rounds"] == len(lines[1]["rounds"])
    # the CPU's name with the vector width torch dispatched to on the machine that wrote the summary
    width = json.loads((run_dir / "summary.json").read_text())["env"]["cpu_capability"]
    assert (row["model"], row["method"], row["controller"], row["hardware"]) == (MODEL, "sparsespec", "entropy",
                                                                               f"{CPU} ({width})")


def test_multirun_tree_finds_every_run_with_its_options(frame):
    n_runs = len(CONTEXTS) * len(SPEEDUP_METHODS) + len(KS) + len(BUDGETS)
    assert frame["run"].nunique() == n_runs
    assert len(frame) == 3 * n_runs
    fixed = frame[frame["method"] == "sparsespec_fixed"]
    assert sorted(fixed["k"].unique()) == KS and set(fixed["controller"]) == {"fixed"}
    budgets = frame[frame["budget"].notna()]
    assert sorted(budgets["budget_frac"].unique()) == BUDGETS
    assert set(frame["experiment"]) == {"speedup_vs_context_cpu", "fixed_k_ablation_cpu", "budget_ablation_cpu"}


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such results folder"):
        load_results(tmp_path / "nope")


def test_torn_last_line_is_skipped(tmp_path):
    run_dir = write_run(tmp_path / "run", "ar", 1000, n_prompts=2)
    with open(run_dir / "samples.jsonl", "a") as f:
        f.write('{"prompt_id": "p9", "tok')
    assert len(load_results(run_dir)) == 2


# ---------------------------------------------------------------- W&B mapping

class FakeFile:
    def __init__(self, name: str, text: str):
        self.name, self.text = name, text

    def download(self, root: str, replace: bool = False):
        path = Path(root) / self.name                   # like W&B: the file's folders are made under root
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.text)


class FakeRun:
    """The parts of wandb.apis.public.Run the loader uses: id, config, summary, files, history."""

    def __init__(self, run_id: str, config: dict, summary: dict, files: dict[str, str], history: list[dict]):
        self.id, self.config, self.summary, self._history = run_id, config, summary, history
        self._files = {n: FakeFile(n, text) for n, text in files.items()}

    def files(self):
        return list(self._files.values())

    def file(self, name):
        return self._files[name]

    def scan_history(self):
        return iter(self._history)


def uploaded_run(run_dir: Path) -> FakeRun:
    """A W&B run that carries the run folder's summary.json and samples.jsonl as files."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return FakeRun(run_dir.name, summary["config"], summary["metrics"],
                   {n: (run_dir / n).read_text() for n in ("summary.json", "samples.jsonl")}, [])


class RecordingConfig(dict):
    def update(self, values, allow_val_change=False):
        super().update(values)


class RecordingWandbRun:
    """Stands in for the run `wandb.init` returns, recording what the harness's tracker logs."""

    def __init__(self, folder: Path, config: dict):
        self.dir, self.history, self.summary = str(folder / "files"), [], {}
        self.config = RecordingConfig(config)
        Path(self.dir).mkdir(parents=True)

    def define_metric(self, *args, **kwargs):
        pass

    def log(self, row: dict):
        self.history.append(row)

    def finish(self):
        pass


def recorded_run(run_dir: Path, tmp: Path, save_files: bool) -> FakeRun:
    """What the W&B API returns for a run that sparsespec/harness/tracking.py logged: the tracker is
    driven, as the runner drives it, with the run folder's results, and its calls are recorded.
    Without `save_files` the run has no result files (the history-only fallback)."""
    from sparsespec.harness.tracking import WandbTracker
    summary = json.loads((run_dir / "summary.json").read_text())
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    recording = RecordingWandbRun(Path(tempfile.mkdtemp(dir=tmp)), summary["config"])
    tracker = WandbTracker(recording)
    for index, sample in enumerate(samples):
        tracker.log_prompt(index, sample)
    tracker.log_summary(summary)
    tracker.log_samples(samples)
    if save_files:
        tracker.save_files([run_dir / "samples.jsonl", run_dir / "summary.json"])
    assert tracker.run is recording, "the tracker gave up on a call (see its warning)"
    table = next(row["samples"] for row in recording.history if "samples" in row)
    path = "media/table/samples_0_0.table.json"
    files = {p.name: p.read_text() for p in Path(recording.dir).iterdir()}
    files[path] = json.dumps({"columns": list(table.columns), "data": table.data})
    history = [{"_step": i, **row} for i, row in enumerate(recording.history) if "samples" not in row]
    return FakeRun(run_dir.name, dict(recording.config),
                   {**recording.summary, "samples": {"_type": "table-file", "path": path}}, files, history)


class FakeApi:
    def __init__(self, runs):
        self._runs, self.calls = runs, []

    def runs(self, path, filters=None):
        self.calls.append((path, filters))
        return self._runs


def _without_origin(df: pd.DataFrame) -> pd.DataFrame:
    return df.drop(columns=["run", "job", "experiment"]).sort_values(["method", "ctx", "k", "budget", "prompt_id"]) \
        .reset_index(drop=True)


def test_wandb_runs_with_uploaded_files_give_the_same_frame_as_local_folders(results, frame, tmp_path):
    api = FakeApi([recorded_run(p.parent, tmp_path, save_files=True) for p in sorted(results.rglob("summary.json"))])
    wandb_df = load_wandb("me/sparsespec", group="speedup_vs_context_cpu", api=api)
    assert api.calls == [("me/sparsespec", {"group": "speedup_vs_context_cpu"})]
    assert list(wandb_df.columns) == list(COLUMNS)
    pd.testing.assert_frame_equal(_without_origin(wandb_df), _without_origin(frame))


# What the tracker's history cannot carry: the per-token lists of each round.
NOT_IN_WANDB_HISTORY = ["rounds"]
ROUND_SCALARS = ["drafted", "accepted", "emitted", "draft_s", "verify_s", "select_s", "draft_steps"]


def test_wandb_runs_without_result_files_map_to_the_same_rows(results, frame, tmp_path):
    api = FakeApi([recorded_run(p.parent, tmp_path, save_files=False) for p in sorted(results.rglob("summary.json"))])
    wandb_df = load_wandb("me/sparsespec", api=api)
    assert api.calls == [("me/sparsespec", None)]
    assert list(wandb_df.columns) == list(COLUMNS)
    got, want = _without_origin(wandb_df), _without_origin(frame)
    pd.testing.assert_frame_equal(got.drop(columns=NOT_IN_WANDB_HISTORY), want.drop(columns=NOT_IN_WANDB_HISTORY))
    for got_rounds, want_rounds in zip(got["rounds"], want["rounds"]):
        assert [[r[f] for f in ROUND_SCALARS] for r in got_rounds] == [[r[f] for f in ROUND_SCALARS]
                                                                       for r in want_rounds]


def test_wandb_run_label_names_the_run(results):
    run_dir = next(p.parent for p in results.rglob("summary.json"))
    rows = rows_from_wandb_run(uploaded_run(run_dir))
    assert {r["run"] for r in rows} == {f"wandb:{run_dir.name}"}


# ---------------------------------------------------------------- metrics

def test_auc_matches_pair_counting_and_the_roc_area():
    rng = np.random.default_rng(0)
    scores = np.round(rng.normal(size=300), 1)          # rounding makes ties
    labels = rng.random(300) < 1 / (1 + np.exp(-scores))
    pos, neg = scores[labels], scores[~labels]
    pairs = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
    assert auc(scores, labels) == pytest.approx(pairs)
    fpr, tpr = roc_curve(scores, labels)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert np.trapezoid(tpr, fpr) == pytest.approx(pairs)
    assert auc([3, 2, 1, 0], [True, True, False, False]) == 1.0
    assert auc([0, 1, 2, 3], [True, True, False, False]) == 0.0
    with pytest.raises(ValueError, match="both classes"):
        auc([1, 2], [True, True])


def test_predicted_ratio_is_the_controllers_objective():
    survival = [0.9, 0.9 * 0.8, 0.9 * 0.8 * 0.5]
    got = predicted_ratio(survival, cost_draft=0.1, cost_verify=1.0)
    want = [(1 + sum(survival[:m])) / (m * 0.1 + 1.0) for m in (1, 2, 3)]
    assert got == pytest.approx(want)
    # a run that did not trace its selection cost: None, or NaN once a frame column holds other runs' costs
    assert predicted_ratio(survival, 0.1, 1.0, float("nan")) == pytest.approx(want)
    assert predicted_ratio(survival, 0.1, 1.0, 0.5) == pytest.approx(
        [(1 + sum(survival[:m])) / (m * 0.1 + 1.5) for m in (1, 2, 3)])


# ---------------------------------------------------------------- figures and tables

def test_efficiency_inversion_axis_follows_the_means_not_an_interval_decades_wide():
    from matplotlib.figure import Figure
    from analysis.plots import _fit_to_means
    ax = Figure().subplots()
    ax.errorbar([2, 4], [8.0, 10.0], yerr=[[1.0, 9.0], [2.0, 38000.0]])
    _fit_to_means(ax, pd.DataFrame({"mean": [8.0, 10.0], "high": [10.0, 38010.0]}))
    assert ax.get_ylim() == (0, 15.0)
    assert any("bars cut" in line.get_label() for line in ax.get_lines())
    quiet = Figure().subplots()
    quiet.errorbar([2, 4], [8.0, 10.0], yerr=[[1.0, 1.0], [2.0, 3.0]])
    _fit_to_means(quiet, pd.DataFrame({"mean": [8.0, 10.0], "high": [10.0, 13.0]}))
    assert quiet.get_ylim()[1] < 15.0 and not any("bars cut" in line.get_label() for line in quiet.get_lines())


@pytest.mark.slow   # writes every figure (the fixture, ~6 s): `make test`
def test_every_figure_is_written_as_png_and_pdf(figures_out):
    for name in set(FIGURES) - {"speedup_vs_depth"}:      # retrieval only: tests/test_analysis_retrieval.py
        stem = f"{name}__{MODEL}__{TASK}"
        for ext in ("png", "pdf"):
            path = figures_out / f"{stem}.{ext}"
            assert path.is_file() and path.stat().st_size > 1000, f"missing {path.name}"


@pytest.mark.slow   # writes every figure (the fixture, ~6 s): `make test`
def test_tables_are_written_in_three_formats(figures_out):
    for stem in ("method_comparison", "measured_costs", "paper_vs_measured", "experiment_costs"):
        for ext in ("csv", "md", "tex"):
            assert (figures_out / f"{stem}.{ext}").is_file(), f"missing {stem}.{ext}"


@pytest.mark.slow   # writes every figure (the fixture, ~6 s): `make test`
def test_method_table_has_a_row_per_setting_and_method(frame, figures_out):
    table = pd.read_csv(figures_out / "method_comparison.csv")
    ours = table[table["ctx"].isin(CONTEXTS)]
    expected = ({(c, m) for c in CONTEXTS for m in SPEEDUP_METHODS}
                | {(2000, f"sparsespec_fixed k={k}") for k in KS} | {(2000, f"sparsespec b={b:.0%}") for b in BUDGETS})
    assert set(zip(ours["ctx"], ours["method"])) == expected
    assert len(table) == len(expected)
    markdown = (figures_out / "method_comparison.md").read_text().splitlines()
    assert len(markdown) == 2 + len(expected)
    assert [cell.strip() for cell in markdown[0].strip("|").split("|")][:2] == ["model", "task"]


def run_speedups(summary_path: Path) -> list[float]:
    """The per-prompt speed-ups over AR of the run beside `summary_path`."""
    lines = (summary_path.parent / "samples.jsonl").read_text().splitlines()
    return [json.loads(line)["speedup_vs_ar"] for line in lines]



@pytest.mark.slow   # writes every figure (the fixture, ~6 s): `make test`
def test_table_value_equals_the_runs_summary_json(results, figures_out):
    summary_path = next(p for p in results.rglob("summary.json")
                        if json.loads(p.read_text())["run"]["method"] == "streaming"
                        and json.loads(p.read_text())["run"]["ctx"] == 4000)
    metrics = json.loads(summary_path.read_text())["metrics"]
    table = pd.read_csv(figures_out / "method_comparison.csv")
    row = table[(table["method"] == "streaming") & (table["ctx"] == 4000)].iloc[0]
    assert row["tokens_per_s"] == pytest.approx(metrics["tokens_per_s"], rel=1e-12)
    assert row["speedup"] == pytest.approx(log_scale_interval(run_speedups(summary_path))[0], rel=1e-12)
    assert row["acceptance_rate"] == pytest.approx(metrics["acceptance_rate"], rel=1e-12)
    assert row["n_prompts"] == metrics["n_prompts"]


def test_speedup_interval_and_costs_in_the_tables_are_the_runs_summary_json(results, frame):
    summary_path = next(p for p in results.rglob("summary.json")
                        if json.loads(p.read_text())["run"]["method"] == "sparsespec"
                        and json.loads(p.read_text())["run"]["ctx"] == 2000
                        and json.loads(p.read_text())["config"]["method"]["options"]["budget"] is None)
    metrics = json.loads(summary_path.read_text())["metrics"]
    table = method_comparison(frame)
    row = table[(table["method"] == "sparsespec") & (table["ctx"] == 2000)].iloc[0]
    speedups = run_speedups(summary_path)
    assert (row["speedup"], row["speedup_ci95_low"], row["speedup_ci95_high"]) == pytest.approx(
        log_scale_interval(speedups))
    assert row["log_speedup_std"] == pytest.approx(np.std(np.log(speedups), ddof=1))
    assert row["speedup_ci95_low"] < row["speedup"] < row["speedup_ci95_high"]
    costs = measured_costs(frame)
    row = costs[(costs["method"] == "sparsespec") & (costs["ctx"] == 2000)].iloc[0]
    assert (row["speedup"], row["speedup_ci95_low"], row["speedup_ci95_high"]) == pytest.approx(
        log_scale_interval(speedups))                                  # from the samples, whatever the summary holds
    assert row["c_draft_ms"] == pytest.approx(metrics["c_draft_s"] * 1e3)
    assert row["c_ar_ms"] == pytest.approx(metrics["c_ar_s"] * 1e3)
    assert (row["bound"], row["bound_reached"]) == pytest.approx((metrics["bound"], metrics["bound_reached"]))
    assert costs.loc[costs["method"] == "ar", "bound"].isna().all()      # AR drafts nothing: no bound


def test_experiment_costs_add_up_the_runs_wall_time(results, figures_out):
    from datetime import datetime
    table = pd.read_csv(figures_out / "experiment_costs.csv").set_index("experiment")
    want: dict[str, float] = {}
    for path in results.rglob("summary.json"):
        run = json.loads(path.read_text())["run"]
        experiment = yaml.safe_load((path.parent / ".hydra" / "hydra.yaml").read_text())["hydra"]["runtime"]["choices"]["experiment"]
        seconds = (datetime.fromisoformat(run["finished"]) - datetime.fromisoformat(run["started"])).total_seconds()
        want[experiment] = want.get(experiment, 0.0) + seconds
    assert sorted(table.index) == sorted(want)
    for experiment, seconds in want.items():
        assert table.loc[experiment, "wall_s_total"] == pytest.approx(seconds)
    assert table.loc["fixed_k_ablation_cpu", "runs"] == len(KS)


def test_experiment_costs_count_a_benchmark_job_once_not_once_per_method():
    """The methods of one benchmark job share its process: each run's start-to-end is the job's, so
    summing runs would count the job once per method."""
    from analysis.tables import experiment_costs
    rows = [{"run": f"matrix/chunk/{job}_qa/{method}", "job": f"matrix/chunk/{job}_qa", "experiment": "matrix_cpu",
             "hardware": "cpu", "run_n_prompts": 3, "run_wall_s": wall}
            for job, wall in ((0, 600.0), (1, 900.0)) for method in ("ar", "sparsespec", "streaming")]
    rows.append({"run": "lone", "job": None, "experiment": "matrix_cpu", "hardware": "cpu", "run_n_prompts": 2,
                 "run_wall_s": 100.0})                           # a run without a job label is its own job
    row = experiment_costs(pd.DataFrame(rows)).iloc[0]
    assert (row["jobs"], row["runs"], row["prompts"]) == (3, 7, 8)
    assert row["wall_s_total"] == pytest.approx(1600.0)


def test_ar_row_is_the_reference(frame):
    table = method_comparison(frame)
    assert (table.loc[table["method"] == "ar", "speedup"] == 1.0).all()


def test_paper_vs_measured_puts_reported_numbers_beside_the_measured_setting(frame):
    table = paper_vs_measured(frame)
    main = table[table["table"].str.startswith("main")]
    assert list(main["paper_method"]) == [e["paper_method"] for e in paper.MAIN_TABLE]
    ours = main[main["method"] == "sparsespec"].iloc[0]
    assert (ours["paper_speedup"], ours["paper_tokens_per_s"]) == (2.79, 10.38)
    measured = method_comparison(frame)
    want = measured[(measured["method"] == "sparsespec") & (measured["ctx"] == max(CONTEXTS))]["speedup"].item()
    assert ours["measured_speedup"] == pytest.approx(want)
    assert ours["measured_ctx"] == max(CONTEXTS)
    for setting in ("model", "hardware", "context", "benchmark"):
        assert setting in ours["differs"]
    fixed = table[table["table"] == "fixed-k ablation"]
    assert list(fixed["paper_speedup"]) == list(paper.FIXED_K_SPEEDUP.values())
    # The fixed-k runs were at 2000 tokens, not the compared (longest) context: not measured there.
    assert fixed["measured_speedup"].iloc[:-1].isna().all()


def test_missing_data_skips_figures_with_a_note(tmp_path, capsys):
    write_sweep(tmp_path / "ar_only", "speedup_vs_context_cpu", [{"method": "ar", "ctx": c} for c in CONTEXTS])
    assert figures_main([str(tmp_path / "ar_only"), "--out", str(tmp_path / "fig"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    for name in FIGURES:
        assert f"skipped {name}" in printed
    assert (tmp_path / "fig" / "method_comparison.csv").is_file()
    assert not list((tmp_path / "fig").glob("*.png"))


def test_empty_folder_is_an_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert figures_main([str(tmp_path / "empty"), "--out", str(tmp_path / "fig"), "--no-progress"]) == 2
    assert "no samples.jsonl" in capsys.readouterr().err


# ---------------------------------------------------------------- notebook

def execute_notebook(results: Path, tmp_path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient
    notebook = nbformat.read(REPO / "notebooks" / "walkthrough.ipynb", as_version=4)
    os.environ["SPARSESPEC_RESULTS"] = str(results)
    os.environ["SPARSESPEC_FIGURES"] = str(tmp_path / "nb_figures")
    try:
        NotebookClient(notebook, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    finally:
        del os.environ["SPARSESPEC_RESULTS"], os.environ["SPARSESPEC_FIGURES"]
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    assert list((tmp_path / "nb_figures").glob("speedup_vs_context__*.png"))


@pytest.mark.slow   # runs a Jupyter kernel in a subprocess
def test_notebook_executes_top_to_bottom(results, tmp_path):
    execute_notebook(results, tmp_path)


# ---------------------------------------------------------------- a real sweep with the harness

REAL_METHODS = ["ar", "sparsespec", "sparsespec_fixed"]


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory) -> Path:
    """A tiny multirun of run.py on the embedded SmolLM2: 1K context (the smallest whose default 10%
    draft budget holds sink + recent), one prompt, 8 new tokens, three methods. Run in this process
    (its output is the first test's captured setup output)."""
    sweep = tmp_path_factory.mktemp("real") / "multirun"
    status = run_py_here(REPO, "-m", "model=smollm2_135m", "task=summarization", "ctx=1k",
                         f"method={','.join(REAL_METHODS)}", "num_prompts=1", "max_new_tokens=8", "warmup=false",
                         "logger=none", f"hydra.sweep.dir={sweep}")
    assert status == 0
    return sweep


@pytest.mark.real_model
def test_analysis_of_a_real_sweep(real_sweep, tmp_path):
    out = tmp_path / "figures"
    assert figures_main([str(real_sweep), "--out", str(out), "--no-progress"]) == 0
    for stem in ("speedup_vs_context__smollm2_135m__summarization",
                 "acceptance_vs_context__smollm2_135m__summarization"):
        assert (out / f"{stem}.png").is_file() and (out / f"{stem}.pdf").is_file()
    table = pd.read_csv(out / "method_comparison.csv")
    summaries = {s["run"]["method"]: s for s in (json.loads(p.read_text()) for p in real_sweep.rglob("summary.json"))}
    fixed_k = summaries["sparsespec_fixed"]["run"]["method_options"].get("k")   # the engine's default, if recorded
    assert sorted(table["method"]) == ["ar", "sparsespec", f"sparsespec_fixed k={fixed_k}" if fixed_k else "sparsespec_fixed"]
    assert set(table["ctx"]) == {1000} and set(table["n_prompts"]) == {1}
    summary = summaries["sparsespec"]
    row = table[table["method"] == "sparsespec"].iloc[0]
    assert row["tokens_per_s"] == pytest.approx(summary["metrics"]["tokens_per_s"], rel=1e-12)
    assert row["speedup"] == pytest.approx(summary["metrics"]["speedup_vs_ar"], rel=1e-12)
    assert row["hardware"] == f"{summary['env']['cpu']} ({summary['env']['cpu_capability']})"


@pytest.mark.real_model
def test_notebook_executes_on_a_real_sweep(real_sweep, tmp_path):
    execute_notebook(real_sweep, tmp_path)


# ---------------------------------------------------------------- conf/experiment

FAMILIES = ("speedup_vs_context", "acceptance_vs_context", "fixed_k_ablation", "budget_ablation",
            "method_comparison", "entropy_analysis", "efficiency_inversion")
# The figure and table experiments (conf/experiment/ also holds others' configs, e.g. smoke).
EXPERIMENTS = sorted(p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml") if p.stem.startswith(FAMILIES))


def swept_values(cfg) -> dict[str, list[str]]:
    return {key: str(values).split(",") for key, values in (cfg.hydra.sweeper.params or {}).items()}


@pytest.fixture(scope="module")
def compose_config():
    from hydra import compose, initialize_config_dir
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        yield lambda overrides: compose("config", overrides=overrides, return_hydra_config=True)


def test_experiments_come_in_paper_and_cpu_scale_with_the_same_methods(compose_config):
    assert set(FAMILIES) | {f"{family}_cpu" for family in FAMILIES} <= set(EXPERIMENTS)
    for name in EXPERIMENTS:
        assert (REPO / "conf" / "experiment" / f"{name}.yaml").read_text().startswith("# @package _global_\n")
        if "_cpu" in name:
            paper_scale = swept_values(compose_config([f"experiment={name.split('_cpu')[0]}"]))
            cpu_scale = swept_values(compose_config([f"experiment={name}"]))
            assert cpu_scale["method"] == paper_scale["method"], name
            assert {k: v for k, v in cpu_scale.items() if k.startswith("method.")} == \
                {k: v for k, v in paper_scale.items() if k.startswith("method.")}, name


@pytest.mark.parametrize("name", slow_but("fixed_k_ablation_cpu", EXPERIMENTS))   # the others ~1-9 s each
def test_every_swept_value_of_an_experiment_composes(compose_config, name):
    cfg = compose_config([f"experiment={name}"])
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    sweep = swept_values(cfg)
    assert "method" in sweep and sweep, f"{name} sweeps nothing"
    for key, values in sweep.items():
        for value in values:
            composed = compose_config([f"experiment={name}", f"{key}={value}"])
            if key == "method":
                assert composed.method.label == value
    models = [compose_config([f"experiment={name}", f"model={m}"]) for m in sweep.get("model", [])]
    for ctx in sweep.get("ctx", []) or [None]:
        for model in models:
            cfg_ctx = compose_config([f"experiment={name}", f"ctx={ctx}"]) if ctx else cfg
            assert cfg_ctx.ctx + cfg_ctx.max_new_tokens <= model.model.max_context, (name, ctx, model.model.name)


def test_every_experiment_has_a_readme_line():
    readme = (REPO / "experiments" / "README.md").read_text()
    for name in EXPERIMENTS:
        assert f"python run.py experiment={name}`" in readme or f"python run.py experiment={name} " in readme, name
