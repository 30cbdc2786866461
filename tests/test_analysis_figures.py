"""analysis.plots and analysis.frames: speed-ups drawn as geometric means with log-scale intervals, a
legend that hides no data, and the efficiency inversion drawn from the k each run chose (known answers)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis import plots
from analysis.frames import chosen_k_rounds, geometric_across_prompts


def test_geometric_across_prompts_is_the_geometric_mean_with_a_log_symmetric_interval():
    df = pd.DataFrame({"g": ["a"] * 3 + ["b"], "v": [2.0, 0.5, 1.0, 3.0]})
    out = geometric_across_prompts(df, ["g"], "v").set_index("g")
    assert out.loc["a", "mean"] == pytest.approx(1.0) and out.loc["a", "n"] == 3
    assert out.loc["a", "low"] * out.loc["a", "high"] == pytest.approx(1.0) and out.loc["a", "low"] > 0
    assert out.loc["b", ["mean", "low", "high"]].tolist() == pytest.approx([3.0] * 3)     # one prompt: no interval


def test_only_rounds_that_drafted_the_chosen_k_count():
    """A fixed k=4 run whose last round was cut to 2 drafts, and a controller run: the cut round goes,
    and so does the controller's last round of each prompt."""
    rounds = pd.DataFrame([
        {"run": "f", "prompt_id": "0", "round": 0, "controller": "fixed", "k": 4.0, "drafted": 4},
        {"run": "f", "prompt_id": "0", "round": 1, "controller": "fixed", "k": 4.0, "drafted": 4},
        {"run": "f", "prompt_id": "0", "round": 2, "controller": "fixed", "k": 4.0, "drafted": 2},
        {"run": "c", "prompt_id": "0", "round": 0, "controller": "entropy", "k": math.nan, "drafted": 7},
        {"run": "c", "prompt_id": "0", "round": 1, "controller": "entropy", "k": math.nan, "drafted": 3},
        {"run": "c", "prompt_id": "1", "round": 0, "controller": "entropy", "k": math.nan, "drafted": 5},
    ])
    kept = chosen_k_rounds(rounds)
    assert list(zip(kept["run"], kept["prompt_id"], kept["round"])) == [("f", "0", 0), ("f", "0", 1), ("c", "0", 0)]


def speedup_frame() -> pd.DataFrame:
    rows = []
    for method, level in (("sparsespec", 2.0), ("streaming", 1.5), ("pld", 1.1)):
        for ctx in (2000, 8000):
            for p, j in enumerate((0.9, 1.0, 1 / 0.9)):
                rows.append({"run": f"{method}-{ctx}", "experiment": "speedup_vs_context_cpu", "model": "m",
                             "task": "qa", "hardware": "cpu", "method": method, "k": math.nan, "budget": math.nan,
                             "ctx": float(ctx), "prompt_id": str(p), "speedup_vs_ar": level * j})
    return pd.DataFrame(rows)


def test_speedup_vs_context_draws_geometric_means_and_its_legend_hides_no_data():
    (stem, fig), = plots.speedup_vs_context(speedup_frame())
    ax = fig.axes[0]
    fig.canvas.draw()
    sparsespec = next(bars for bars in ax.containers if bars.get_label() == "sparsespec")
    assert np.allclose(sparsespec.lines[0].get_ydata(), 2.0)     # geometric mean of 2 x (0.9, 1, 1/0.9)
    legend = ax.get_legend().get_window_extent()
    assert legend.x0 >= ax.get_window_extent().x1                 # beside the axes, never over them


def test_method_table_leaves_acceptance_empty_for_a_run_that_drafted_nothing():
    from analysis.tables import method_comparison
    def run(name, method, rounds, acceptance):
        return {"run": name, "experiment": "method_comparison", "model": "m", "task": "qa", "source": "embedded",
                "hardware": "cpu", "ctx": 1000.0, "method": method, "k": math.nan, "budget": math.nan,
                "prompt_id": "0", "rounds": rounds, "run_n_prompts": 1, "run_acceptance_rate": acceptance,
                "run_outputs_match_ar": 1.0, "speedup_vs_ar": 1.0,
                **{c: 1.0 for c in ("run_tokens_per_s", "run_ar_tokens_per_s", "run_mean_accepted")}}
    df = pd.DataFrame([run("a", "pld", [{"drafted": 0, "accepted": 0}], 0.0),
                       run("b", "streaming", [{"drafted": 4, "accepted": 0}], 0.0)])
    table = method_comparison(df).set_index("method")
    assert math.isnan(table.loc["pld", "acceptance_rate"])
    assert table.loc["streaming", "acceptance_rate"] == 0.0          # drafted, none accepted: a true 0%


def test_speedup_vs_context_shows_the_papers_point_for_the_methods_drawn():
    (stem, fig), = plots.speedup_vs_context(speedup_frame())
    ax = fig.axes[0]
    stars = [line for line in ax.get_lines() if line.get_label().startswith("paper: ")]
    assert len(stars) == 1 and "SparseSpec-L 2.79×" in stars[0].get_label()     # streaming/pld: not in the paper's table
    assert list(stars[0].get_xdata()) == [64000] and 64000 in ax.get_xticks()


def test_the_inversion_is_a_longer_fixed_k_that_accepts_more_yet_runs_slower():
    from analysis.frames import fixed_k_inversion
    def cell(speeds: dict, accepted: dict) -> pd.DataFrame:
        return pd.DataFrame([{"method": "sparsespec_fixed", "k": float(k), "tokens_per_s": s * j,
                              "mean_accepted": accepted[k]} for k, s in speeds.items() for j in (0.9, 1 / 0.9)])
    assert fixed_k_inversion(cell({4: 10.0, 16: 8.0}, {4: 4.0, 16: 9.0})) is True       # k=16 accepts more, runs slower
    assert fixed_k_inversion(cell({4: 10.0, 16: 12.0}, {4: 4.0, 16: 9.0})) is False     # the longest k is fastest
    assert fixed_k_inversion(cell({4: 10.0}, {4: 4.0})) is None
