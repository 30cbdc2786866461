"""analysis.batch: the batch speed-up is a geometric mean with its interval on the log scale (synthetic
frames with known answers; tests/test_batch.py reads a real harness sweep)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import batch as batch_analysis
from helpers import log_scale_interval


def test_batch_speedup_is_a_geometric_mean_over_batches_on_the_log_scale():
    """One ratio a batch (its row 0; the other rows repeat it), B = 1 over prompts; the interval is
    exp(mean log +- t s / sqrt(n)), so it never reaches below 0."""
    rows = [{"run": "b2", "batch_size": 2.0, "batch_row": float(r), "batch_speedup_vs_ar": ratio,
             "speedup_vs_ar": 9.0} for ratio in (1.2, 2.4, 0.9) for r in (0, 1)]
    rows += [{"run": "b1", "batch_size": math.nan, "batch_row": math.nan, "batch_speedup_vs_ar": math.nan,
              "speedup_vs_ar": ratio} for ratio in (1.5, 3.0)]
    got = batch_analysis.run_speedups(pd.DataFrame(rows))
    for run, ratios in (("b2", [1.2, 2.4, 0.9]), ("b1", [1.5, 3.0])):
        assert tuple(got.loc[run]) == pytest.approx(log_scale_interval(ratios))
    assert got.loc["b1", "speedup_low"] > 0
    table = batch_analysis.fmt(pd.DataFrame({"speedup": [2.0], "speedup_low": [1.5], "speedup_high": [2.6], "n": [3]}))
    assert table["speedup"].iloc[0] == "2.00× [1.50, 2.60]"
