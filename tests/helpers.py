"""Reference computations the tests check the analysis against, done here independently with scipy
(imported as `from helpers import ...`: tests/ is on sys.path, as for conftest)."""
from __future__ import annotations

import math

import numpy as np
from scipy import stats as scipy_stats


def log_scale_interval(ratios, level: float = 0.95) -> tuple[float, float, float]:
    """Geometric mean and its Student-t interval on the log scale, exp(mean(log r) -+ t s / sqrt(n)), from
    scipy's one-sample t test of the logs."""
    logs = np.log(np.asarray(ratios, dtype=float))
    interval = scipy_stats.ttest_1samp(logs, 0.0).confidence_interval(level)
    return math.exp(logs.mean()), math.exp(interval.low), math.exp(interval.high)
