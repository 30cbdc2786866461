"""Derived tidy frames from the loaded results: per-round and per-draft-token rows, aggregates
across prompts, and the labels the figures and tables use."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.load import FIXED_K_METHODS
from analysis.metrics import predicted_ratio
from sparsespec import stats

# Columns that identify a setting, carried onto the per-round and per-token frames.
SETTING_COLUMNS = ["run", "experiment", "model", "task", "hardware", "ctx", "method", "controller",
                   "k", "budget", "budget_frac", "prompt_id"]


def method_label(method: str, k: float = math.nan, budget: float = math.nan) -> str:
    """`sparsespec`, `sparsespec_fixed k=8`, `sparsespec b=5%`: a method plus its swept options."""
    label = str(method)
    if k is not None and not _isnan(k):
        label += f" k={int(k)}"
    if budget is not None and not _isnan(budget):
        label += f" b={budget:.0%}" if budget < 1 else f" b={int(budget)}"
    return label


def _isnan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def with_labels(df: pd.DataFrame) -> pd.DataFrame:
    """`df` plus a `label` column: the method, plus k and the budget where they tell its runs apart
    (k always for fixed-k SparseSpec-L; an option left at its default reads as the plain name)."""
    out = df.copy()
    show_k = {m: m in FIXED_K_METHODS or _varies(rows["k"]) for m, rows in out.groupby("method")}
    show_budget = {m: _varies(rows["budget"]) for m, rows in out.groupby("method")}
    out["label"] = [method_label(m, k if show_k.get(m) else math.nan, b if show_budget.get(m) else math.nan)
                    for m, k, b in zip(out["method"], out["k"], out["budget"])]
    return out


def _varies(values: pd.Series) -> bool:
    """More than one distinct value, a missing one (the default) counting as a value."""
    return values.astype("float64").fillna(-1.0).nunique() > 1


def select_experiment(df: pd.DataFrame, names: tuple[str, ...]) -> pd.DataFrame:
    """The rows of the named experiments (their `_cpu...` variants included) when any are there,
    else every row: a figure drawn from a mixed results folder prefers the runs made for it."""
    mask = df["experiment"].fillna("").astype(str).str.startswith(tuple(names))
    return df[mask] if mask.any() else df


def across_prompts(df: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Mean, standard deviation, standard error, count and the half-width of the Student-t 95%
    confidence interval of the mean (`sparsespec.stats.mean_ci`; 0 below two prompts) of `value`
    across prompts, per group."""
    grouped = df.dropna(subset=[value]).groupby(by, dropna=False)[value]
    out = grouped.agg(mean="mean", std="std", n="count").reset_index()
    out["std"] = out["std"].fillna(0.0)
    out["sem"] = out["std"] / np.sqrt(out["n"].clip(lower=1))
    half_widths = grouped.apply(lambda values: _ci_half_width(values.tolist()))
    out["ci95"] = half_widths.to_numpy() if len(out) else []
    return out


def geometric_across_prompts(df: pd.DataFrame, by: list[str], value: str) -> pd.DataFrame:
    """Geometric mean, its Student-t 95% interval on the log scale (`analysis.estimates.geometric`;
    low = high = mean below two prompts) and the count of a positive ratio `value` across prompts, per group."""
    from analysis.estimates import geometric
    records = []
    for key, values in df.dropna(subset=[value]).groupby(by, dropna=False, sort=True)[value]:
        est = geometric(values)
        records.append({**dict(zip(by, key if isinstance(key, tuple) else (key,))), "mean": est.ratio,
                        "low": est.ratio if est.low is None else est.low,
                        "high": est.ratio if est.high is None else est.high, "n": est.n})
    return pd.DataFrame(records, columns=[*by, "mean", "low", "high", "n"])


RETRIEVAL = "retrieval"          # the task whose samples carry the depth of their evidence
DEPTH_STEP = 0.1                 # depth bins: the retrieval task places evidence at 10%-90% in steps of 10%
DEPTH_COLUMNS = ["model", "ctx", "label", "depth", "n", "speedup", "low", "high", "exact_match"]


def depth_bin(depth: pd.Series) -> pd.Series:
    """A depth (the fraction of the context before the evidence) rounded half up to the nearest DEPTH_STEP:
    the line start the task found near a requested 0.3 may sit at 0.297 or 0.304."""
    steps = (depth.astype(float) / DEPTH_STEP).round(9)      # 0.35 / 0.1 is 3.4999999999999996 in floating point
    return (np.floor(steps + 0.5) * DEPTH_STEP).round(6)


def retrieval_by_depth(df: pd.DataFrame) -> pd.DataFrame:
    """Per model, context, method label and depth bin of the retrieval task's samples: n prompts, the
    speed-up over AR (geometric mean with its 95% interval on the log scale; NaN for AR itself) and the
    exact-match accuracy (mean score: the share of the asked items the output contains). Methods are
    told apart by `label` (`with_labels` when absent). Empty (DEPTH_COLUMNS) without retrieval samples."""
    from analysis.estimates import geometric
    rows = df[(df["task"] == RETRIEVAL) & df["depth"].notna()]
    if rows.empty:
        return pd.DataFrame(columns=DEPTH_COLUMNS)
    rows = (rows if "label" in rows else with_labels(rows)).assign(depth=lambda d: depth_bin(d["depth"]), ctx=lambda d: d["ctx"].astype(int))
    records = []
    for (model, ctx, label, depth), group in rows.groupby(["model", "ctx", "label", "depth"], sort=True):
        speedup = geometric(group["speedup_vs_ar"] if label != "ar" else [])     # AR is the reference
        records.append({"model": model, "ctx": ctx, "label": label, "depth": depth, "n": len(group),
                        **dict(zip(("speedup", "low", "high"), speedup.columns())),
                        "exact_match": group["score"].mean()})
    return pd.DataFrame(records, columns=DEPTH_COLUMNS)


def fixed_k_inversion(cell: pd.DataFrame) -> bool | None:
    """The efficiency inversion among one cell's fixed-k runs (rows labelled by `with_labels`): the
    longest fixed k accepts more tokens per round than the fastest fixed k (geometric mean tokens/s over
    prompts), yet is not the fastest. None with fewer than two fixed k."""
    from analysis.estimates import geometric
    fixed = cell[cell["method"].isin(FIXED_K_METHODS) & cell["k"].notna()]
    if fixed["k"].nunique() < 2:
        return None
    by_k = fixed.groupby("k")
    speed = by_k["tokens_per_s"].agg(lambda v: geometric(v).ratio)
    accepted = by_k["mean_accepted"].mean()
    fastest, longest = speed.idxmax(), speed.index.max()
    return bool(longest != fastest and accepted[longest] > accepted[fastest])


def chosen_k_rounds(rounds: pd.DataFrame) -> pd.DataFrame:
    """The rounds that drafted the k their run chose: a fixed-k run's rounds that drafted exactly k (an
    end round cut short by the token limit drafts fewer), and every round of a run that picks k itself
    except each prompt's last (the one the token limit may cut)."""
    fixed = rounds["controller"] == "fixed"
    as_chosen = rounds["drafted"] == rounds["k"]
    last = rounds["round"] == rounds.groupby(["run", "prompt_id"])["round"].transform("max")
    return rounds[(fixed & as_chosen) | (~fixed & ~last)]


def _ci_half_width(values: list[float]) -> float:
    ci = stats.mean_ci(values)
    return 0.0 if ci.high is None else (ci.high - ci.low) / 2


def pooled_rates(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Acceptance rate and mean accepted length per group, pooled over every round of its samples
    (`sparsespec.stats`, as the run summaries define them)."""
    records = []
    for key, group in df.groupby(by, dropna=False, sort=True):
        totals = stats.round_totals(r for rounds in group["rounds"] for r in (rounds or []))
        records.append({**dict(zip(by, key if isinstance(key, tuple) else (key,))),
                        "acceptance_rate": stats.acceptance_rate(totals.accepted, totals.drafted),
                        "mean_accepted": stats.mean_accepted(totals.emitted, totals.rounds)})
    return pd.DataFrame(records, columns=[*by, "acceptance_rate", "mean_accepted"])


def rounds_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per decode round of every sample, with its setting and per-round throughput."""
    records = []
    for _, row in df.iterrows():
        setting = {c: row[c] for c in SETTING_COLUMNS}
        for index, r in enumerate(row["rounds"] or []):
            records.append({**setting, **_round_record(index, r)})
    return pd.DataFrame(records, columns=SETTING_COLUMNS + ROUND_COLUMNS)


ROUND_COLUMNS = ["round", "drafted", "accepted", "emitted", "draft_s", "verify_s", "select_s",
                 "round_s", "round_tokens_per_s", "cost_draft", "cost_verify", "cost_select",
                 "predicted_ratio", "survival", "choice", "cost_ar"]


def _round_record(index: int, r: dict) -> dict:
    round_s = float(r.get("draft_s", 0.0)) + float(r.get("verify_s", 0.0)) + float(r.get("select_s") or 0.0)
    survival = list(r.get("survival") or [])
    c_d, c_v, c_s = r.get("cost_draft"), r.get("cost_verify"), r.get("cost_select")
    predicted = (float(predicted_ratio(survival, c_d, c_v, c_s)[-1])
                 if survival and c_d is not None and c_v is not None else math.nan)
    return {"round": index, "drafted": r.get("drafted"), "accepted": r.get("accepted"),
            "emitted": r.get("emitted"), "draft_s": r.get("draft_s"), "verify_s": r.get("verify_s"),
            "select_s": r.get("select_s"), "round_s": round_s,
            "round_tokens_per_s": r.get("emitted", 0) / round_s if round_s > 0 else math.nan,
            "cost_draft": c_d, "cost_verify": c_v, "cost_select": c_s, "predicted_ratio": predicted,
            "survival": survival, "choice": r.get("choice") or "", "cost_ar": r.get("cost_ar")}


def draft_tokens_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per *judged* draft token: the accepted ones and the first rejected one of a round.

    Tokens after the first rejection were never compared with the target, so they are neither
    accepted nor rejected and are left out.
    """
    records = []
    for _, row in df.iterrows():
        setting = {c: row[c] for c in SETTING_COLUMNS}
        for index, r in enumerate(row["rounds"] or []):
            records += _judged_tokens(setting, index, r)
    return pd.DataFrame(records, columns=SETTING_COLUMNS + ["round", "position", "entropy",
                                                            "accept_prob", "accepted"])


def _judged_tokens(setting: dict, index: int, r: dict) -> list[dict]:
    entropies = list(r.get("entropies") or [])
    probs = list(r.get("accept_probs") or [])
    accepted = int(r.get("accepted", 0))
    judged = min(len(entropies), accepted + 1)
    return [{**setting, "round": index, "position": i + 1, "entropy": float(entropies[i]),
             "accept_prob": float(probs[i]) if i < len(probs) else math.nan,
             "accepted": i < accepted} for i in range(judged)]


def speculative(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of methods that draft (acceptance is defined): every method but plain decoding."""
    drafted = df["rounds"].map(lambda rounds: any((r.get("drafted") or 0) > 0 for r in rounds or []))
    return df[drafted & (df["method"] != "ar")]


def distinct(df: pd.DataFrame, column: str) -> list[str]:
    """The values a column holds, once each, sorted, as text (missing ones left out): e.g. the machines
    a cell was timed on."""
    return sorted({str(v) for v in df[column].dropna()})


def setting_title(df: pd.DataFrame) -> str:
    """`model · task · hardware` of a figure's data (several values joined with '/')."""
    parts = []
    for column in ("model", "task", "hardware"):
        values = distinct(df, column)
        parts.append("/".join(values) if values else f"? {column}")
    return " · ".join(parts)


# ------------------------------------------------------------------------ a budget sweep (analysis.selection)

RECYCLED = "sparsespec_fixed"                 # recycled top-K at a fixed k: the draft under test
DRAFTS = (RECYCLED, "streaming", "snapkv_static")
SELECTION_CELL = ["model", "task", "ctx", "k"]  # k too: a sweep at k=4 and one at k=16 are separate cells


def percent(fraction: float) -> str:
    """0.02 -> `2%`, 0.025 -> `2.5%`: distinct budgets never share a label."""
    return f"{fraction * 100:g}%"


def selection_samples(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (cell, draft, budget, prompt). `draft` is the run's method label (options other than
    k and budget stay in it: `sparsespec_fixed recent=16`); `label` adds the budget, for pairing."""
    base = df["method"].astype(str).str.split(" ").str[0]
    out = df[base.isin(DRAFTS) & df["budget_frac"].notna()].copy()
    if out.empty:
        raise SystemExit(f"error: no run of {', '.join(DRAFTS)} with a draft budget in these results; "
                         f"run `python run.py experiment=selection_budget_cpu` first")
    out["ctx"] = out["ctx"].astype(int)
    out["k"] = out["k"].astype(int)
    out["draft"] = out["method"].astype(str)
    out["budget_frac"] = out["budget_frac"].round(4)
    out["label"] = [f"{d} b={percent(b)}" for d, b in zip(out["draft"], out["budget_frac"])]
    # a prompt twice in a cell, or a cell of mixed code: analysis.provenance.check_poolable(out, ..., SELECTION_CELL)
    return out.reindex(columns=[*SELECTION_CELL, "draft", "budget_frac", "label", "prompt_id", "tokens_per_s",
                                "speedup_vs_ar", "mean_accepted", "outputs_match_ar", "run_c_draft_s", "run_c_verify_s",
                                "run_select_s_per_round", "run", "commit", "code"])
