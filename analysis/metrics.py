"""Small numeric helpers: ROC / AUC and the controller's predicted efficiency."""
from __future__ import annotations

from typing import Sequence

import math

import numpy as np
from scipy.stats import rankdata


def roc_curve(scores: Sequence[float], labels: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """(false positive rate, true positive rate) as the threshold sweeps down the scores.

    A higher score predicts a positive label. Tied scores move both rates in one step, so the
    curve is the one whose area `auc` returns.
    """
    scores = np.asarray(scores, dtype=float)
    labels = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"ROC needs both classes; got {n_pos} positive and {n_neg} negative labels")
    order = np.argsort(-scores, kind="mergesort")
    scores, labels = scores[order], labels[order]
    last_of_tie = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]
    tps = np.cumsum(labels)[last_of_tie]
    fps = (last_of_tie + 1) - tps
    return np.r_[0.0, fps / n_neg], np.r_[0.0, tps / n_pos]


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties count half.

    Computed from ranks (Mann-Whitney U), independently of `roc_curve`.
    """
    scores = np.asarray(scores, dtype=float)
    labels = np.asarray(labels, dtype=bool)
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"AUC needs both classes; got {n_pos} positive and {n_neg} negative labels")
    ranks = rankdata(scores)                    # 1-based, ties given their average rank
    u = ranks[labels].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


def predicted_ratio(survival: Sequence[float], cost_draft: float, cost_verify: float,
                    cost_select: float | None = None) -> np.ndarray:
    """The controller's objective for every prefix length m = 1..k of one round:
    (1 + sum_{j<=m} pi_j) / (m * C_d + C_v + C_s), in expected tokens per second (C_s: the round's KV
    selection; 0 in runs that did not trace it, whose None a frame column holding other runs' costs
    turns into NaN)."""
    survival = np.asarray(survival, dtype=float)
    m = np.arange(1, len(survival) + 1)
    untraced = cost_select is None or math.isnan(float(cost_select))
    return (1.0 + np.cumsum(survival)) / (m * float(cost_draft) + float(cost_verify)
                                          + (0.0 if untraced else float(cost_select)))
