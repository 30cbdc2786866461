"""Ratios on the log scale, per cell and pooled over cells, and the three-way verdict they give.

Speeds are compared as ratios (method A's decode tokens/s over method B's on the same prompt), and
ratios average on the log scale: the geometric mean, with its interval exp(mean(log r) +- t s/sqrt(n)).
A ratio of 2 and one of 1/2 then cancel, and no interval reaches below 0.

Pooled over cells, a comparison is one mixed model (statsmodels MixedLM, REML) with cells as blocks
and prompts within cells:

    log r[cell, prompt] = mu + u[cell] + e[cell, prompt],   u ~ N(0, tau^2), e ~ N(0, sigma^2)

exp(mu) is the pooled ratio, with its 95% Wald interval. Where the mixed model cannot be fitted (no
spread within any cell, a singular fit, no convergence), the blocked paired test stands in and says
so: a Student-t interval over the cells' mean logs, each cell one block. "Grows with context" is the slope of the log
speed-up against log2 context (so exp(slope) is the factor per doubling of context), with a random
intercept per block (a cell, or a model/task series when pooled, its cells nested as a variance component).

A claim is reproduced when the 95% interval lies wholly on the claimed side of no effect (a ratio of
1, a slope of 0), contradicted only when it lies wholly on the other side, and inconclusive otherwise.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from sparsespec import stats
from sparsespec.stats import CONTRADICTED, INCONCLUSIVE, NOT_MEASURABLE, REPRODUCED, Estimate

LEVEL = 0.95
NO_SPREAD = 1e-9                             # log-ratio SD below which a cell's prompts count as identical
Z = float(scipy_stats.norm.ppf((1 + LEVEL) / 2))   # standard normal quantile: the mixed model's Wald interval

NONE = Estimate(None, None, None, 0, 0)


def from_columns(ratio, low, high, n, cells: int = 1) -> Estimate:
    """An Estimate back from a table's columns (`Estimate.columns`), to print it with `text()`: a missing
    (NaN) ratio is no estimate, a missing low or high no interval."""
    missing = lambda x: x is None or (isinstance(x, float) and math.isnan(x))   # noqa: E731
    if missing(ratio):
        return NONE
    if missing(low) or missing(high):
        return Estimate(float(ratio), None, None, 0 if missing(n) else int(n), cells)
    return Estimate(float(ratio), float(low), float(high), 0 if missing(n) else int(n), cells)


def combined_verdict(verdicts: list[str]) -> str:
    """A claim made of several comparisons: contradicted if any is, reproduced only if all are, not
    measurable if none could be measured, inconclusive otherwise."""
    measured = [v for v in verdicts if v != NOT_MEASURABLE]
    if not measured:
        return NOT_MEASURABLE
    if CONTRADICTED in measured:
        return CONTRADICTED
    return REPRODUCED if len(measured) == len(verdicts) and set(measured) == {REPRODUCED} else INCONCLUSIVE


def _logs(values) -> np.ndarray:
    return np.asarray(stats.log_ratios(float(v) for v in values if v is not None), dtype=float)


def geometric(values) -> Estimate:
    """Geometric mean of positive ratios (one cell's prompts) with its Student-t 95% interval on the
    log scale (`sparsespec.stats.geometric_ci`, the harness's summary.json uses the same)."""
    ci = stats.geometric_ci(float(v) for v in values if v is not None)
    if ci.mean is None:
        return NONE
    return replace(ci, how="one prompt" if ci.low is None else "t over prompts")


def pooled(ratios: pd.Series, cells: pd.Series) -> Estimate:
    """The pooled ratio over cells: a random-intercept mixed model of log ratio with cells as blocks
    (one cell: the geometric mean over its prompts)."""
    keep = ratios.notna().to_numpy()                 # a missing ratio drops with its cell label
    ratios, cells = ratios[keep], cells[keep]
    frame = pd.DataFrame({"y": _logs(ratios) if len(ratios) else [], "cell": cells.astype(str).to_numpy()})
    if frame["cell"].nunique() < 2:
        return geometric(ratios)
    if (frame.groupby("cell")["y"].std().fillna(0) < NO_SPREAD).all():
        return blocked(frame)          # no spread within any cell: the mixed model's likelihood is degenerate
    return mixed_estimate(frame, "y ~ 1", "Intercept", blocked, frame["cell"].nunique(), groups="cell")


def blocked(frame: pd.DataFrame, why: str = "") -> Estimate:
    """The blocked paired test: the geometric mean of the cells' geometric means, with a Student-t
    interval over cells (each cell one block, whatever its number of prompts)."""
    means = frame.groupby("cell")["y"].mean().tolist()
    ci = stats.mean_ci(means)
    p = None                                  # no spread between the cells' means: no test
    if ci.std:
        with warnings.catch_warnings():       # cell means equal but for rounding warn of precision loss; p is then ~0
            warnings.simplefilter("ignore", RuntimeWarning)
            p = float(scipy_stats.ttest_1samp(means, 0.0).pvalue)
    return Estimate(math.exp(ci.mean), math.exp(ci.low), math.exp(ci.high), len(frame), ci.n, p,
                    how="t over cell means" + why)


def context_slope(speedups: pd.Series, ctx: pd.Series, blocks: pd.Series, cells: pd.Series | None = None) -> Estimate:
    """The factor by which the speed-up changes per doubling of context: exp of the slope of log
    speed-up on log2 ctx, with a random intercept per block (and `cells` nested in the blocks as a
    variance component, when given). `n` counts prompts, `cells` the distinct contexts x blocks.
    Fewer than 3 cells (two contexts cannot tell a slope from noise between cells): no estimate. A fit
    that puts the variance between cells at 0 gives way to least squares over cell means (`blocked_slope`):
    a handful of cells cannot show that spread is absent, and the slope varies only between cells."""
    keep = speedups.notna().to_numpy()
    speedups, ctx, blocks = speedups[keep], ctx[keep], blocks[keep]
    cells = None if cells is None else cells[keep]
    frame = pd.DataFrame({"y": _logs(speedups), "x": np.log2(ctx.astype(float).to_numpy()),
                          "block": blocks.astype(str).to_numpy(),
                          "cell": (cells if cells is not None else blocks.astype(str) + "/" + ctx.astype(str))
                          .astype(str).to_numpy()})
    n_cells = frame["cell"].nunique()
    if n_cells < 3 or frame["x"].nunique() < 2:
        return Estimate(None, None, None, len(frame), n_cells)
    nested = cells is not None and frame["block"].nunique() < n_cells
    est = mixed_estimate(frame, "y ~ x", "x", blocked_slope, n_cells, groups="block",
                         vc_formula={"cell": "0 + C(cell)"} if nested else None)
    if est.how == BOUNDARY:   # no spread between cells estimated: its SE would count prompts, not the cells the slope rests on
        return blocked_slope(frame, why=" (the mixed model put the variance between cells at 0)")
    return est


def mixed_estimate(frame: pd.DataFrame, formula: str, param: str, fallback, n_cells: int, **fit_options) -> Estimate:
    """exp of `param`'s mixed-model estimate with its 95% interval; `fallback(frame, why=...)` instead
    when the fit is singular, gives no standard error, or does not converge."""
    # statsmodels' optimizer can land on a different optimum (or none) for the same rows in another
    # order, so the rows are fitted in one canonical order: the estimate depends on the data alone
    frame = frame.sort_values(sorted(frame.columns), kind="mergesort").reset_index(drop=True)
    try:
        fit = _mixed_fit(frame, formula, **fit_options)
    except np.linalg.LinAlgError:
        return fallback(frame, why=" (the mixed model's information matrix was singular)")
    mu, se = fit.fe_params[param], fit.bse_fe[param]
    if not (math.isfinite(mu) and math.isfinite(se)):
        return fallback(frame, why=" (the mixed model gave no standard error)")
    if not fit.converged:
        return fallback(frame, why=" (the mixed model did not converge)")
    return Estimate(math.exp(mu), math.exp(mu - Z * se), math.exp(mu + Z * se), len(frame), n_cells,
                    float(fit.pvalues[param]), how=_how(fit))


def blocked_slope(frame: pd.DataFrame, why: str = "") -> Estimate:
    """The blocked fallback of `context_slope`: least squares of each cell's mean log speed-up on log2
    ctx, one intercept per block, with its Student-t interval (no estimate without a residual degree of
    freedom). Blocks that are the cells themselves (one series, each cell its own block) get one
    intercept: an intercept per cell would leave nothing for the slope."""
    import statsmodels.formula.api as smf
    means = frame.groupby(["block", "cell"], as_index=False).agg(y=("y", "mean"), x=("x", "first"))
    formula = "y ~ x + C(block)" if 1 < means["block"].nunique() < len(means) else "y ~ x"
    fit = smf.ols(formula, means).fit()
    if fit.df_resid < 1:
        return Estimate(None, None, None, len(frame), len(means), how="too few cells for a slope" + why)
    b, (low, high) = fit.params["x"], fit.conf_int(alpha=1 - LEVEL).loc["x"]
    p = float(fit.pvalues["x"]) if math.isfinite(fit.pvalues["x"]) else None
    return Estimate(math.exp(b), math.exp(low), math.exp(high), len(frame), len(means), p,
                    how="least squares over cell means" + why)


def _mixed_fit(frame: pd.DataFrame, formula: str, groups: str, vc_formula: dict | None = None):
    """statsmodels MixedLM by REML, with the convergence warnings it gave (`fit.warned`); callers
    replace a fit that did not converge (`fit.converged`)."""
    import statsmodels.formula.api as smf
    from statsmodels.tools.sm_exceptions import ConvergenceWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConvergenceWarning)
        warnings.simplefilter("ignore", RuntimeWarning)      # boundary fits (no spread between cells) warn here
        model = smf.mixedlm(formula, frame, groups=frame[groups], vc_formula=vc_formula,
                            re_formula="1")
        fit = model.fit(reml=True)          # statsmodels' optimizers in turn (bfgs, then lbfgs) until one converges
        fit.bse_fe                          # computed lazily: a negative variance's sqrt warns here, not in the caller
    fit.warned = [str(w.message) for w in caught if issubclass(w.category, ConvergenceWarning)]
    return fit


BOUNDARY = "mixed model (a variance at 0)"


def _how(fit) -> str:
    """`mixed model`, noting a variance estimated at 0 (no spread between cells: the fit then pools those
    prompts as one sample)."""
    return BOUNDARY if any("boundary" in w for w in fit.warned) else "mixed model"
