"""analysis.estimates: log-scale ratios, pooled over cells, and the three-way verdict, on synthetic
data whose answer is known by construction."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis import estimates
from analysis.estimates import CONTRADICTED, INCONCLUSIVE, NOT_MEASURABLE, REPRODUCED, Estimate

JITTER = np.array([0.9, 1.0, 1 / 0.9 * 1.02, 1 / 1.02])      # log-symmetric around 1: geometric mean exactly 1


def test_geometric_mean_and_its_interval_are_taken_on_the_log_scale():
    est = estimates.geometric([2.0, 0.5])
    assert est.ratio == pytest.approx(1.0)                   # 2x and 1/2x cancel (arithmetic mean: 1.25)
    assert est.low * est.high == pytest.approx(1.0) and est.low > 0
    assert est.text() == f"1.00× [{est.low:.2f}, {est.high:.2f}]"
    assert estimates.geometric([1.5]).text() == "1.50× (n=1)"
    with pytest.raises(ValueError, match="positive"):
        estimates.geometric([1.0, -0.2])


def test_the_verdict_has_three_outcomes_and_contradicts_only_when_the_interval_excludes_the_claim():
    assert Estimate(1.2, 1.05, 1.4, 10, 2).verdict() == REPRODUCED
    assert Estimate(0.8, 0.7, 0.95, 10, 2).verdict() == CONTRADICTED
    assert Estimate(0.9, 0.7, 1.1, 10, 2).verdict() == INCONCLUSIVE        # below 1, but 1 is inside
    assert Estimate(1.2, None, None, 1, 1).verdict() == INCONCLUSIVE       # no interval
    assert estimates.NONE.verdict() == NOT_MEASURABLE
    assert estimates.combined_verdict([REPRODUCED, REPRODUCED]) == REPRODUCED
    assert estimates.combined_verdict([REPRODUCED, INCONCLUSIVE]) == INCONCLUSIVE
    assert estimates.combined_verdict([REPRODUCED, CONTRADICTED]) == CONTRADICTED
    assert estimates.combined_verdict([REPRODUCED, NOT_MEASURABLE]) == INCONCLUSIVE
    assert estimates.combined_verdict([NOT_MEASURABLE]) == NOT_MEASURABLE


def cells_frame(effects: dict[str, float], jitter=JITTER) -> pd.DataFrame:
    """Per cell, the ratio effect x a log-symmetric prompt jitter (so each cell's geometric mean is its effect)."""
    return pd.DataFrame([{"cell": cell, "ratio": effect * j} for cell, effect in effects.items() for j in jitter])


def test_pooled_ratio_of_a_balanced_design_is_the_geometric_mean_of_the_cells():
    """Equal prompts per cell: the mixed model's estimate is the mean of the cells' mean logs."""
    effects = {"a": 1.05, "b": 1.10, "c": 1.02, "d": 1.12, "e": 1.07}
    df = cells_frame(effects)
    est = estimates.pooled(df["ratio"], df["cell"])
    assert est.ratio == pytest.approx(math.exp(np.mean(np.log(list(effects.values())))), rel=1e-6)
    assert (est.n, est.cells) == (20, 5)
    assert est.low > 1 and est.verdict() == REPRODUCED and est.p < 0.05
    assert est.how.startswith("mixed model")
    behind = cells_frame({c: 1 / e for c, e in effects.items()})
    assert estimates.pooled(behind["ratio"], behind["cell"]).verdict() == CONTRADICTED


def test_cells_are_blocks_not_extra_prompts():
    """Cells that disagree widely: the pooled interval must be wider than pooling every prompt as one sample."""
    df = cells_frame({"a": 0.8, "b": 1.5, "c": 0.9, "d": 1.4}, jitter=np.array([0.99, 1 / 0.99]))
    pooled = estimates.pooled(df["ratio"], df["cell"])
    naive = estimates.geometric(df["ratio"])
    assert pooled.ratio == pytest.approx(naive.ratio, rel=1e-6)
    assert pooled.high / pooled.low > naive.high / naive.low


def test_identical_prompts_within_cells_fall_back_to_the_blocked_test_over_cell_means():
    df = cells_frame({"a": 1.1, "b": 1.2, "c": 1.15}, jitter=np.ones(3))
    est = estimates.pooled(df["ratio"], df["cell"])
    assert est.how == "t over cell means" and est.cells == 3
    assert est.ratio == pytest.approx((1.1 * 1.2 * 1.15) ** (1 / 3))


def test_the_blocked_test_is_scipys_one_sample_t_test_of_the_cell_means():
    """Its interval and p-value against a ratio of 1 are those of a t test of the cells' mean logs (each cell
    one block, whatever its number of prompts); no spread between cells: no p-value."""
    from scipy import stats as scipy_stats
    frame = pd.DataFrame({"cell": ["a"] * 3 + ["b"] * 2 + ["c"] * 4 + ["d"],
                          "y": np.log([1.1, 1.1, 1.1, 1.3, 1.3, 0.95, 0.95, 0.95, 0.95, 1.2])})
    test = scipy_stats.ttest_1samp(np.log([1.1, 1.3, 0.95, 1.2]), 0.0)
    interval = test.confidence_interval(0.95)
    est = estimates.blocked(frame)
    assert (est.n, est.cells) == (10, 4)
    assert est.p == pytest.approx(test.pvalue, rel=1e-12)
    assert (est.low, est.high) == (pytest.approx(math.exp(interval.low), rel=1e-13),
                                   pytest.approx(math.exp(interval.high), rel=1e-13))
    assert estimates.blocked(frame.assign(y=0.5)).p is None


def test_the_mixed_models_wald_interval_uses_the_normal_quantile():
    from scipy import stats as scipy_stats
    assert estimates.Z == scipy_stats.norm.ppf(0.975) == pytest.approx(1.959963984540054, abs=1e-15)


def test_context_slope_recovers_the_change_per_doubling():
    """speed-up = 1.3 x 1.08 ** log2(ctx / 2000) x jitter, two series: the slope is 1.08 per doubling."""
    rows = [{"series": s, "ctx": ctx, "speedup": base * 1.08 ** math.log2(ctx / 2000) * j}
            for s, base in (("m/qa", 1.3), ("m/code", 1.6)) for ctx in (2000, 4000, 8000, 16000) for j in JITTER]
    df = pd.DataFrame(rows)
    cell = df["series"] + "/" + df["ctx"].astype(str)
    pooled = estimates.context_slope(df["speedup"], df["ctx"], df["series"], cell)
    assert pooled.ratio == pytest.approx(1.08, rel=1e-4) and pooled.verdict() == REPRODUCED
    assert (pooled.n, pooled.cells) == (32, 8)
    one = df[df["series"] == "m/qa"]
    alone = estimates.context_slope(one["speedup"], one["ctx"], cell[one.index])
    assert alone.ratio == pytest.approx(1.08, rel=1e-4)
    two_contexts = one[one["ctx"] <= 4000]
    assert estimates.context_slope(two_contexts["speedup"], two_contexts["ctx"], cell[two_contexts.index]).ratio is None


def three_cells_of_one_series(seed: int = 14) -> pd.DataFrame:
    """3, 3 and 12 prompts at 2K, 4K and 8K, each cell at its own random level (a series like a model's QA
    task with one cell of 12 prompts): a shape where statsmodels' optimizer depends on the rows' order."""
    rng = np.random.default_rng(seed)
    rows = []
    for ctx, n in ((2000, 3), (4000, 3), (8000, 12)):
        level = rng.normal(0.3, 0.1)
        rows += [{"ctx": ctx, "speedup": float(np.exp(level + rng.normal(0, 0.15)))} for _ in range(n)]
    df = pd.DataFrame(rows)
    return df.assign(cell="qa/" + df["ctx"].astype(str))


def test_the_context_slope_depends_on_the_rows_and_not_on_their_order():
    df = three_cells_of_one_series()
    fits = set()
    for order in range(5):
        d = df.sample(frac=1, random_state=order) if order else df
        est = estimates.context_slope(d["speedup"], d["ctx"], d["cell"])
        fits.add((est.text(), est.how, est.verdict()))
    assert len(fits) == 1, fits


def test_a_slope_whose_fit_finds_no_spread_between_cells_rests_on_the_cell_means(monkeypatch):
    """A boundary fit's interval counts prompts; the slope varies only between cells, so their means decide."""
    df = three_cells_of_one_series()
    boundary = Estimate(1.17, 1.14, 1.20, len(df), 3, 0.001, how=estimates.BOUNDARY)
    monkeypatch.setattr(estimates, "mixed_estimate", lambda *args, **kwargs: boundary)
    est = estimates.context_slope(df["speedup"], df["ctx"], df["cell"])
    means = df.groupby("ctx")["speedup"].apply(lambda v: np.log(v).mean())
    slope = np.polyfit(np.log2(means.index.to_numpy(dtype=float)), means.to_numpy(), 1)[0]
    assert est.ratio == pytest.approx(math.exp(slope))
    assert est.how.startswith("least squares over cell means") and "variance between cells at 0" in est.how
    assert est.high - est.low > boundary.high - boundary.low


def test_the_blocked_slope_fits_cell_means_with_one_intercept_per_block():
    """The fallback when the mixed model cannot fit: 1.1 per doubling in both series, whatever their level."""
    rows = [{"y": math.log(base * 1.1 ** math.log2(ctx / 1000) * j), "x": math.log2(ctx), "block": b,
             "cell": f"{b}/{ctx}"} for b, base in (("s1", 1.2), ("s2", 2.0)) for ctx in (1000, 2000, 4000)
            for j in (0.95, 1 / 0.95)]
    est = estimates.blocked_slope(pd.DataFrame(rows))
    assert est.ratio == pytest.approx(1.1) and est.how == "least squares over cell means"
    assert (est.n, est.cells) == (12, 6)
    two = pd.DataFrame([r for r in rows if r["block"] == "s1" and r["x"] < 11.5])
    assert estimates.blocked_slope(two).ratio is None                     # two cells: no residual freedom
    # one series whose cells are its blocks (context_slope's call per model and task): one intercept
    series = pd.DataFrame([{**r, "block": r["cell"]} for r in rows if r["block"] == "s1"])
    alone = estimates.blocked_slope(series)
    assert alone.ratio == pytest.approx(1.1) and (alone.n, alone.cells) == (6, 3)


def test_a_missing_ratio_is_dropped_with_its_cell_label():
    df = cells_frame({"a": 1.1, "b": 1.2, "c": 1.05})
    with_gap = df.copy()
    with_gap.loc[0, "ratio"] = float("nan")
    est = estimates.pooled(with_gap["ratio"], with_gap["cell"])
    assert est.n == len(df) - 1 and est.cells == 3
