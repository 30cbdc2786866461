"""The retrieval task in the analysis: speed-up and exact match by the depth of the evidence (a table, a
figure drawn only when retrieval samples exist) and its place in the claims, on small synthetic run
folders whose expected values the tests compute from the samples they wrote."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import claims, publish
from analysis.figures import main as figures_main
from analysis.frames import depth_bin, retrieval_by_depth
from analysis.load import load_results
from helpers import log_scale_interval

MODEL, CTX, AR_TPS = "m", 4000, 10.0
# per prompt: (depth as the task measured it, SparseSpec-L's speed-up, streaming's, exact-match score)
RETRIEVAL_PROMPTS = [(0.103, 1.9, 1.1, 1.0), (0.098, 2.3, 1.2, 0.5), (0.497, 1.6, 1.3, 1.0),
                     (0.502, 2.0, 1.0, 1.0), (0.904, 1.4, 0.9, 0.0), (0.896, 1.7, 1.05, 0.25)]


def write_run(folder: Path, task: str, method: str, samples: list[dict]) -> None:
    """One run folder as the harness writes it, reduced to what analysis.load reads."""
    folder.mkdir(parents=True)
    summary = {"run": {"model": MODEL, "task": task, "source": "embedded", "method": method, "ctx": CTX},
               "config": {"method": {"name": method, "options": {}}}, "metrics": {"n_prompts": len(samples)}}
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))


def sample(prompt: str, speedup: float | None, score: float | None = None, depth: float | None = None) -> dict:
    speculative = speedup is not None
    return {"prompt_id": prompt, "context_tokens": CTX, "new_tokens": 32, "tokens_per_s": AR_TPS * (speedup or 1.0),
            "ar_tokens_per_s": AR_TPS, "speedup_vs_ar": speedup if speculative else 1.0,
            "outputs_match_ar": True if speculative else None, "mean_accepted": 3.0 if speculative else 1.0,
            "score": score, "depth": depth,
            "rounds": [{"drafted": 4 if speculative else 0, "accepted": 2 if speculative else 0, "emitted": 3}]}


def write_retrieval(root: Path) -> None:
    for method, column in (("ar", None), ("sparsespec", 1), ("streaming", 2)):
        write_run(root / "retrieval" / method, "retrieval", method,
                  [sample(f"{i:03d}", None if column is None else p[column], p[3], p[0])
                   for i, p in enumerate(RETRIEVAL_PROMPTS)])


def write_claimed_tasks(root: Path, speedups=(1.8, 2.0, 2.2)) -> None:
    """summarization, qa and code, SparseSpec-L clearly ahead of AR: no depth, no score."""
    for task in claims.CLAIMED_TASKS:
        write_run(root / task / "ar", task, "ar", [sample(f"{i:03d}", None) for i in range(3)])
        write_run(root / task / "sparsespec", task, "sparsespec",
                  [sample(f"{i:03d}", x) for i, x in enumerate(speedups)])



def expected_by_depth(column: int) -> dict[float, tuple]:
    """{depth bin: (geometric mean, low, high, mean score)} from RETRIEVAL_PROMPTS, two prompts a bin."""
    bins = {0.1: RETRIEVAL_PROMPTS[0:2], 0.5: RETRIEVAL_PROMPTS[2:4], 0.9: RETRIEVAL_PROMPTS[4:6]}
    return {depth: (*log_scale_interval([p[column] for p in prompts]), np.mean([p[3] for p in prompts]))
            for depth, prompts in bins.items()}


def test_depth_bins_round_half_up_to_the_nearest_tenth():
    got = depth_bin(pd.Series([0.297, 0.304, 0.25, 0.35, 0.049, 1.0]))
    assert list(got) == pytest.approx([0.3, 0.3, 0.3, 0.4, 0.0, 1.0])


def test_the_depth_table_is_each_methods_geometric_speedup_and_exact_match_per_depth(tmp_path):
    write_retrieval(tmp_path / "runs")
    write_claimed_tasks(tmp_path / "runs")              # tasks without a depth stay out of the table
    table = retrieval_by_depth(load_results(tmp_path / "runs")).set_index(["label", "depth"])
    assert set(table.index.get_level_values("label")) == {"ar", "sparsespec", "streaming"}
    for label, column in (("sparsespec", 1), ("streaming", 2)):
        for depth, (mean, low, high, score) in expected_by_depth(column).items():
            row = table.loc[(label, depth)]
            assert (row["speedup"], row["low"], row["high"]) == pytest.approx((mean, low, high))
            assert row["exact_match"] == pytest.approx(score) and row["n"] == 2
    ar = table.loc["ar"]
    assert ar["speedup"].isna().all()                   # the reference has no speed-up over itself
    assert list(ar["exact_match"]) == pytest.approx([0.75, 1.0, 0.125])


def test_the_depth_figure_is_drawn_when_retrieval_samples_exist_and_not_otherwise(tmp_path, capsys):
    write_claimed_tasks(tmp_path / "without")
    assert figures_main([str(tmp_path / "without"), "--out", str(tmp_path / "fig0"), "--no-progress",
                         "--only", "speedup_vs_depth"]) == 0
    assert not list((tmp_path / "fig0").glob("speedup_vs_depth*"))
    assert "skipped speedup_vs_depth: no retrieval samples" in capsys.readouterr().out
    write_retrieval(tmp_path / "with")
    assert figures_main([str(tmp_path / "with"), "--out", str(tmp_path / "fig1"), "--no-progress",
                         "--only", "speedup_vs_depth"]) == 0
    drawn = sorted(p.name for p in (tmp_path / "fig1").glob("speedup_vs_depth*"))
    assert drawn == [f"speedup_vs_depth__{MODEL}__retrieval__{CTX}.{ext}" for ext in ("pdf", "png")]


def test_the_depth_figure_draws_speed_up_on_a_log_axis_where_few_prompt_intervals_stay_readable(tmp_path):
    from analysis import plots
    write_retrieval(tmp_path / "runs")
    [(name, fig)] = plots.speedup_vs_depth(load_results(tmp_path / "runs"))
    speed, match = fig.axes[:2]
    assert speed.get_yscale() == "log" and match.get_yscale() == "linear"
    assert "log scale" in speed.get_ylabel()


def test_the_claims_show_retrieval_with_its_exact_match_beside_speed_and_judge_the_three_tasks(tmp_path):
    write_retrieval(tmp_path / "runs")
    write_claimed_tasks(tmp_path / "runs")
    s = claims.samples(load_results(tmp_path / "runs"))
    across = claims.claim_across_tasks(s)
    assert across.verdict == "reproduced"               # retrieval is shown beside the three, not judged with them
    pooled = across.pooled.set_index("comparison")
    retrieval = pooled.loc["retrieval, speed-up over AR at each model's longest context"]
    scores = [p[3] for p in RETRIEVAL_PROMPTS]
    want = f"{np.mean(scores):.0%} (AR {np.mean(scores):.0%}, {len(scores)} prompts)"
    assert retrieval["exact match"] == want
    assert retrieval["estimate [95% CI]"].startswith(f"{log_scale_interval([p[1] for p in RETRIEVAL_PROMPTS])[0]:.2f}×")
    assert (pooled.drop(retrieval.name)["exact match"] == "–").all()
    assert f"exact match {want}" in across.summary
    quality = claims.claim_quality(s).evidence.set_index("label")
    assert quality.loc["streaming", "retrieval exact match"] == want

    assert claims.main([str(tmp_path / "runs"), "--no-figures"]) == 0
    document = (tmp_path / "runs" / "claims.md").read_text()
    assert "## Retrieval: speed-up and exact match by depth" in document
    mean, low, high, _ = expected_by_depth(1)[0.5]
    assert f"| 50%     | 2         | {mean:.2f}× [{low:.2f}, {high:.2f}]" in document


def test_without_retrieval_the_claims_gain_no_accuracy_column_and_no_depth_section(tmp_path):
    write_claimed_tasks(tmp_path / "runs")
    s = claims.samples(load_results(tmp_path / "runs"))
    assert "exact match" not in claims.claim_across_tasks(s).pooled
    assert "retrieval exact match" not in claims.claim_quality(s).evidence
    assert publish.depth_table(s).empty
