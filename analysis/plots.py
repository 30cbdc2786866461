"""The paper's figures, drawn from the tidy results DataFrame (see analysis.load).

Every figure function takes the DataFrame and returns a list of (file stem, Figure), one per
model x task; it raises `SkipFigure` with a one-line reason when its data is absent.
Speed-ups and the efficiency inversion's speeds per round are the geometric mean over prompts with
its Student-t 95% interval on the log scale (`analysis.estimates`); other error bars are +-1 standard deviation across prompts. Acceptance
rate and mean accepted length are pooled over rounds, as in every run summary.
"""
from __future__ import annotations

import re
from typing import Callable, Iterator

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from analysis import paper
from analysis.frames import (across_prompts, chosen_k_rounds, draft_tokens_frame, fixed_k_inversion,
                             geometric_across_prompts, pooled_rates, RETRIEVAL, retrieval_by_depth, rounds_frame, select_experiment,
                             setting_title, speculative, with_labels)
from analysis.metrics import auc, predicted_ratio, roc_curve
from analysis.estimates import geometric

FigureList = list[tuple[str, Figure]]


class SkipFigure(Exception):
    """The data a figure needs is not in the results; the message says what is missing."""


# ---------------------------------------------------------------- helpers

def slug(text: object) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "-", str(text)).strip("-") or "none"


def per_model_task(df: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame]]:
    """(`model__task` file suffix, rows) for each model x task in `df`."""
    for (model, task), rows in df.groupby(["model", "task"], dropna=False, sort=True):
        yield f"{slug(model)}__{slug(task)}", rows


def new_figure(ncols: int = 1, width: float = 6.4, height: float = 4.2) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def context_axis(ax, contexts) -> None:
    """A log2 context-length axis labelled in K tokens (1K = 1000, as the harness's conf/ctx/ names)."""
    contexts = sorted({int(c) for c in contexts})
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts)
    ax.set_xticklabels([f"{c / 1000:g}K" if c >= 1000 else str(c) for c in contexts])
    ax.set_xlabel("context length (tokens, log scale)")


ERROR_BARS = {"std": "±1 s.d. across prompts", "ci95": "95% CI of the mean over prompts (Student t)",
              "log95": "geometric mean, 95% CI on the log scale (Student t)"}


def caption(fig: Figure, rows: pd.DataFrame, what: str, err: str = "std", prompts: pd.Series | None = None) -> None:
    """The figure's title, its setting, its error bars and n per point: `prompts` (a count per point), by
    default each run's prompts."""
    prompts = rows.groupby("run")["prompt_id"].nunique() if prompts is None else prompts
    n = f"{prompts.min()}-{prompts.max()}" if len(prompts) and prompts.min() != prompts.max() else (
        f"{prompts.min()}" if len(prompts) else "0")
    fig.suptitle(f"{what}\n{setting_title(rows)}\nerror bars: {ERROR_BARS[err]} (n = {n} per point)",
                 fontsize=10)


def errorbar_lines(ax, stats: pd.DataFrame, x: str, by: str, err: str = "std") -> None:
    """One errorbar line per value of `by` (stats from `across_prompts`; `err` names the bars' column)."""
    for key, line in stats.groupby(by, sort=True):
        line = line.sort_values(x)
        ours = str(key) == "sparsespec"            # the method under study stands out
        yerr = [line["mean"] - line["low"], line["high"] - line["mean"]] if err == "log95" else line[err]
        ax.errorbar(line[x], line["mean"], yerr=yerr, marker="o", capsize=3, label=str(key),
                    linewidth=2.6 if ours else 1.4, zorder=5 if ours else 2)


def legend_outside(ax) -> None:
    """The legend right of the axes, where it can hide no data point or error bar."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


# ---------------------------------------------------------------- speedup / acceptance vs context

def speedup_vs_context(df: pd.DataFrame) -> FigureList:
    rows = with_labels(select_experiment(df, ("speedup_vs_context",)))
    rows = rows[rows["method"] != "ar"].dropna(subset=["speedup_vs_ar", "ctx"])
    if rows.empty:
        raise SkipFigure("no sample has speedup_vs_ar (no speculative method with an AR reference)")
    figures = []
    for suffix, group in per_model_task(rows):
        fig, (ax,) = new_figure(width=8.4)          # room for the legend beside the axes
        stats = geometric_across_prompts(group, ["label", "ctx"], "speedup_vs_ar")
        errorbar_lines(ax, stats, "ctx", "label", err="log95")
        ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1, label="ar (1.00×)")
        shown = _paper_points(ax, set(group["label"]))
        context_axis(ax, [*group["ctx"], *([paper.SETTING["ctx"]] if shown else [])])
        ax.set_ylabel("decode speed-up over AR (×, geometric mean)")
        legend_outside(ax)
        caption(fig, group, "Speedup vs context length", err="log95")
        figures.append((f"speedup_vs_context__{suffix}", fig))
    return figures


def _paper_points(ax, labels: set[str]) -> bool:
    """The paper's reported speed-ups at its context (hollow stars) for the methods drawn; whether any was."""
    reported = [row for row in paper.MAIN_TABLE if row["method"] in labels and row["method"] != "ar"]
    for row in reported:
        ax.plot([paper.SETTING["ctx"]], [row["speedup"]], marker="*", markersize=11, mfc="none", linestyle="none",
                color="0.25", label=f"paper: {row['paper_method']} {row['speedup']:.2f}× "
                                    f"({paper.SETTING['model']}, {paper.SETTING['hardware']})")
    return bool(reported)


def acceptance_vs_context(df: pd.DataFrame) -> FigureList:
    rows = with_labels(speculative(select_experiment(df, ("acceptance_vs_context", "speedup_vs_context"))))
    rows = rows.dropna(subset=["ctx"])
    if rows.empty:
        raise SkipFigure("no speculative method drafted any token")
    figures = []
    for suffix, group in per_model_task(rows):
        fig, (left, right) = new_figure(ncols=2, width=5.2)
        pooled = pooled_rates(group, ["label", "ctx"])           # points: pooled over rounds
        rate = across_prompts(group.assign(pct=group["acceptance_rate"] * 100), ["label", "ctx"], "pct")
        rate = rate.drop(columns="mean").merge(pooled.assign(mean=pooled["acceptance_rate"] * 100), on=["label", "ctx"])
        errorbar_lines(left, rate, "ctx", "label")
        left.set_ylabel("acceptance rate (% of drafted tokens, pooled)")
        length = across_prompts(group, ["label", "ctx"], "mean_accepted")
        length = length.drop(columns="mean").merge(pooled.assign(mean=pooled["mean_accepted"]), on=["label", "ctx"])
        errorbar_lines(right, length, "ctx", "label")
        right.set_ylabel("mean accepted length (tokens / round, bonus incl.)")
        for ax in (left, right):
            context_axis(ax, group["ctx"])
        left.legend(fontsize=8)
        caption(fig, group, "Acceptance and mean accepted length vs context length")
        figures.append((f"acceptance_vs_context__{suffix}", fig))
    return figures


def speedup_vs_depth(df: pd.DataFrame) -> FigureList:
    """The retrieval task, per model and context: the speed-up over AR (left) and the exact-match accuracy
    (right) against the depth of the evidence, one line per method (one colour a method in both panels)."""
    table = retrieval_by_depth(df)
    if table.empty:
        raise SkipFigure(f"no {RETRIEVAL} samples with a depth (task={RETRIEVAL})")
    table = table.assign(depth_pct=table["depth"] * 100)
    figures = []
    for (model, ctx), group in table.groupby(["model", "ctx"], sort=True):
        fig, (left, right) = new_figure(ncols=2, width=5.2)
        speculative_rows = group[group["label"] != "ar"]
        errorbar_lines(left, speculative_rows.rename(columns={"speedup": "mean"}), "depth_pct", "label", err="log95")
        left.axhline(1.0, color="0.3", linestyle="--", linewidth=1)
        # log axis: a bin holds a prompt or two, so its interval can span 100x, which a linear axis
        # draws as one bar flattening every point; on the log scale the interval is symmetric, as computed
        left.set_yscale("log")
        left.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}×"))
        left.set_ylabel("speed-up over AR (geo. mean, log scale)")
        for label, line in [*speculative_rows.groupby("label", sort=True), ("ar", group[group["label"] == "ar"])]:
            line = line.sort_values("depth_pct")          # same order as the left panel: the same colours
            style = {"color": "0.2", "linestyle": "--"} if label == "ar" else {}
            right.plot(line["depth_pct"], line["exact_match"] * 100, marker="o", label=str(label),
                       linewidth=2.6 if label == "sparsespec" else 1.4, **style)
        right.set_ylabel("exact match (% of the asked items in the output)")
        right.set_ylim(-5, 105)
        depths = sorted(group["depth_pct"].unique())
        for ax in (left, right):
            ax.set_xticks(depths)
            ax.set_xticklabels([f"{d:g}%" for d in depths])
            ax.set_xlabel("depth of the evidence (% of the context before it)")
        legend_outside(right)
        rows = df[(df["model"] == model) & (df["task"] == RETRIEVAL) & (df["ctx"] == ctx)]
        caption(fig, rows, f"Retrieval at {ctx / 1000:g}K: speed-up and exact match vs depth", err="log95",
                prompts=group["n"])
        figures.append((f"speedup_vs_depth__{slug(model)}__{RETRIEVAL}__{ctx}", fig))
    return figures


# ---------------------------------------------------------------- ablations

def fixed_k_ablation(df: pd.DataFrame) -> FigureList:
    fixed = select_experiment(df, ("fixed_k_ablation",))
    fixed = fixed[(fixed["controller"] == "fixed") & fixed["k"].notna() & fixed["method"].str.startswith("sparsespec")]
    fixed = fixed.dropna(subset=["speedup_vs_ar"])
    if fixed["k"].nunique() < 2:
        raise SkipFigure("needs fixed-k runs (sparsespec_fixed) at two or more k with an AR reference")
    controlled = df[(df["controller"] == "entropy") & df["budget"].isna()].dropna(subset=["speedup_vs_ar"])
    figures = []
    for suffix, group in per_model_task(fixed):
        fig, (ax,) = new_figure()
        stats = geometric_across_prompts(group, ["ctx", "k"], "speedup_vs_ar")
        for i, (ctx, line) in enumerate(stats.groupby("ctx", sort=True)):
            color = f"C{i}"
            ax.errorbar(line["k"], line["mean"], yerr=[line["mean"] - line["low"], line["high"] - line["mean"]],
                        marker="o", capsize=3, color=color, label=f"fixed k, ctx {int(ctx)}")
            _controller_band(ax, controlled, group, ctx, color)
        ax.plot(list(k for k in paper.FIXED_K_SPEEDUP if k), [v for k, v in paper.FIXED_K_SPEEDUP.items() if k],
                "s--", color="0.6", mfc="none", label=f"paper fixed k ({paper.SETTING['model']}, "
                                                      f"{paper.SETTING['hardware']})")
        ax.axhline(paper.FIXED_K_SPEEDUP[None], color="0.6", linestyle=":", label="paper controller")
        ax.set_xticks(sorted(group["k"].unique()))
        ax.set_xlabel("draft length k (tokens, fixed)")
        ax.set_ylabel("decode speedup over autoregressive (×)")
        ax.legend(fontsize=7)
        caption(fig, group, "Fixed-k ablation vs the entropy controller", err="log95")
        figures.append((f"fixed_k_ablation__{suffix}", fig))
    return figures


def _controller_band(ax, controlled: pd.DataFrame, group: pd.DataFrame, ctx: float, color: str) -> None:
    """The controller's geometric mean speedup (and its 95% CI) at the same model, task and context, if measured."""
    same = controlled[(controlled["model"] == group["model"].iloc[0]) &
                      (controlled["task"] == group["task"].iloc[0]) & (controlled["ctx"] == ctx)]
    if same.empty:
        return
    ci = geometric(same["speedup_vs_ar"])
    ax.axhline(ci.ratio, color=color, linestyle="--", label=f"controller, ctx {int(ctx)}")
    if ci.low is not None:
        ax.axhspan(ci.low, ci.high, color=color, alpha=0.12)


def budget_ablation(df: pd.DataFrame) -> FigureList:
    rows = with_labels(select_experiment(df, ("budget_ablation",)))
    rows = rows[rows["budget_frac"].notna()].dropna(subset=["speedup_vs_ar"])
    if rows["budget_frac"].round(4).nunique() < 2:
        raise SkipFigure("needs runs at two or more draft budgets (method.options.budget)")
    figures = []
    for suffix, group in per_model_task(rows):
        group = group.assign(budget_pct=(group["budget_frac"] * 100).round(1),
                             series=group["method"] + " ctx " + group["ctx"].astype(int).astype(str),
                             pct=group["acceptance_rate"] * 100)
        fig, (left, right) = new_figure(ncols=2, width=5.2)
        errorbar_lines(left, geometric_across_prompts(group, ["series", "budget_pct"], "speedup_vs_ar"),
                       "budget_pct", "series", err="log95")
        left.set_ylabel("decode speedup over autoregressive (×)")
        errorbar_lines(right, across_prompts(group, ["series", "budget_pct"], "pct"), "budget_pct", "series")
        right.set_ylabel("acceptance rate (% of drafted tokens)")
        for ax in (left, right):
            ax.set_xlabel("draft budget (% of the KV cache)")
            ax.axvline(paper.SETTING["budget_frac"] * 100, color="0.6", linestyle=":", linewidth=1)
        left.legend(fontsize=8)
        caption(fig, group, "Draft budget ablation (dotted: the paper's best, ~10%; speed-up bars: geometric mean, "
                "95% CI on the log scale)")
        figures.append((f"budget_ablation__{suffix}", fig))
    return figures


# ---------------------------------------------------------------- entropy

def _entropy_tokens(df: pd.DataFrame) -> pd.DataFrame:
    rows = speculative(select_experiment(df, ("entropy_analysis",)))
    tokens = draft_tokens_frame(rows)
    if tokens.empty or tokens["accepted"].all() or not tokens["accepted"].any():
        raise SkipFigure("needs draft entropies of both accepted and rejected tokens")
    return tokens


def entropy_distributions(df: pd.DataFrame) -> FigureList:
    tokens = _entropy_tokens(df)
    figures = []
    for suffix, group in per_model_task(tokens):
        fig, (ax,) = new_figure()
        bins = np.linspace(0, max(group["entropy"].max(), 1e-3), 40)
        for accepted, name, color in ((True, "accepted", "C2"), (False, "rejected", "C3")):
            values = group.loc[group["accepted"] == accepted, "entropy"]
            if values.empty:
                continue
            ax.hist(values, bins=bins, density=True, alpha=0.5, color=color,
                    label=f"{name} (n={len(values)}, mean {values.mean():.2f} nats)")
            ax.axvline(values.mean(), color=color, linestyle="--")
        ax.set_xlabel("draft-token entropy (nats)")
        ax.set_ylabel("density (1 / nat)")
        ax.legend(fontsize=8)
        caption_rows = group.drop_duplicates(["run", "prompt_id"])
        fig.suptitle(f"Entropy of accepted vs first-rejected draft tokens\n{setting_title(caption_rows)}",
                     fontsize=11)
        figures.append((f"entropy_distributions__{suffix}", fig))
    return figures


def entropy_roc(df: pd.DataFrame) -> FigureList:
    tokens = _entropy_tokens(df)
    figures = []
    for suffix, group in per_model_task(tokens):
        fig, (ax,) = new_figure(width=5.0, height=4.6)
        for method, rows in group.groupby("method", sort=True):
            if rows["accepted"].nunique() < 2:
                continue
            fpr, tpr = roc_curve(-rows["entropy"], rows["accepted"])
            ax.plot(fpr, tpr, label=f"{method}: AUC {auc(-rows['entropy'], rows['accepted']):.3f} "
                                    f"(n={len(rows)})")
        ax.plot([0, 1], [0, 1], color="0.6", linestyle=":", label="chance (AUC 0.5)")
        ax.set_xlabel("false positive rate (rejected tokens predicted accepted)")
        ax.set_ylabel("true positive rate (accepted tokens predicted accepted)")
        ax.set_title(f"paper summaries report AUC ≈ {paper.ENTROPY_AUC}", fontsize=8)
        ax.legend(fontsize=8, loc="lower right")
        fig.suptitle(f"Low draft entropy as a predictor of acceptance (ROC)\n"
                     f"{setting_title(group.drop_duplicates(['run', 'prompt_id']))}", fontsize=11)
        figures.append((f"entropy_roc__{suffix}", fig))
    return figures


def pick_trace_sample(df: pd.DataFrame) -> pd.Series:
    """The controller run's sample with the most rounds (the longest trace), else any speculative."""
    rows = speculative(select_experiment(df, ("entropy_analysis",)))
    controlled = rows[rows["controller"] == "entropy"]
    rows = controlled if not controlled.empty else rows
    has_entropy = rows["rounds"].map(lambda rs: any(r.get("entropies") for r in rs))
    rows = rows[has_entropy]
    if rows.empty:
        raise SkipFigure("no speculative sample has per-round draft entropies")
    return rows.loc[rows["n_rounds"].idxmax()]


def entropy_trace(df: pd.DataFrame) -> FigureList:
    sample = pick_trace_sample(df)
    fig = Figure(figsize=(9, 5.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    for index, r in enumerate(sample["rounds"]):
        entropies, accepted = r.get("entropies") or [], int(r.get("accepted", 0))
        for i, entropy in enumerate(entropies):
            color, z = ("C2", 3) if i < accepted else ("C3", 3) if i == accepted else ("0.75", 2)
            top.scatter([index], [entropy], c=color, s=12, zorder=z)
    top.scatter([], [], c="C2", s=12, label="accepted")
    top.scatter([], [], c="C3", s=12, label="first rejected")
    top.scatter([], [], c="0.7", s=12, label="not verified (after a rejection)")
    top.set_ylabel("draft-token entropy (nats)")
    top.legend(fontsize=8)
    rounds = np.arange(len(sample["rounds"]))
    bottom.step(rounds, [r.get("drafted", 0) for r in sample["rounds"]], where="mid", label="chosen k (drafted)")
    bottom.step(rounds, [r.get("accepted", 0) for r in sample["rounds"]], where="mid", label="accepted")
    bottom.set_xlabel("decode round")
    bottom.set_ylabel("tokens")
    bottom.legend(fontsize=8)
    fig.suptitle(f"Entropy and chosen k over one generation: {sample['method']}, prompt {sample['prompt_id']}, "
                 f"ctx {int(sample['ctx'])}\n{sample['model']} · {sample['task']} · {sample['hardware']}",
                 fontsize=11)
    return [(f"entropy_trace__{slug(sample['model'])}__{slug(sample['task'])}", fig)]


# ---------------------------------------------------------------- efficiency inversion

def efficiency_inversion(df: pd.DataFrame) -> FigureList:
    rows = speculative(select_experiment(df, ("efficiency_inversion",)))
    rounds = rounds_frame(rows)
    if not rounds.empty:      # only k as chosen: a round cut short by the token limit says nothing of its k
        rounds = chosen_k_rounds(rounds)
        rounds = rounds[(rounds["drafted"] > 0) & rounds["round_tokens_per_s"].notna()]
    if rounds.empty or rounds["drafted"].nunique() < 2:
        raise SkipFigure("needs speculative rounds at two or more draft lengths k")
    # The prediction needs the entropy controller's traces; fixed-k runs record none, so they come
    # from any controller run at the same model, task and context.
    traces = rounds_frame(speculative(df[df["controller"] == "entropy"]))
    figures = []
    for suffix, group in per_model_task(rounds):
        fig, (left, right) = new_figure(ncols=2, width=7.4)      # room for each legend beside its axes
        # SparseSpec-L's rows by who chose k; every other drafter (streaming, pld, ...) keeps its own line
        own = group["method"].astype(str).str.startswith("sparsespec")
        group = group.assign(k_from=group["controller"].map({"fixed": "fixed k", "entropy": "controller's k"})
                             .where(own).fillna(group["method"]))
        per_prompt = group.groupby(["k_from", "run", "prompt_id", "drafted"], as_index=False)[
            "round_tokens_per_s"].mean()
        tops = []
        for k_from, rows_k in per_prompt.groupby("k_from", sort=True):
            stats = geometric_across_prompts(rows_k, ["drafted"], "round_tokens_per_s")
            left.errorbar(stats["drafted"], stats["mean"], yerr=[stats["mean"] - stats["low"], stats["high"] - stats["mean"]],
                          marker="o", capsize=3, label=f"measured, {k_from} (emitted / round time)")
            _mark_best(left, stats["drafted"], stats["mean"])
            tops.append(stats[["mean", "high"]])
        _fit_to_means(left, pd.concat(tops))
        left.set_xlabel("draft length k (tokens)")
        left.set_ylabel("tokens / s per round (measured)")
        left.plot([], [], color="0.5", linestyle=":", label="fastest k of each line")
        left.plot([], [], linestyle="none", label=_inversion_note(rows, group["model"].iloc[0], group["task"].iloc[0]))
        legend_outside(left)
        _predicted_panel(right, traces[(traces["model"] == group["model"].iloc[0]) &
                                       (traces["task"] == group["task"].iloc[0]) &
                                       traces["ctx"].isin(group["ctx"].unique())] if not traces.empty else traces)
        caption(fig, rows[(rows["model"] == group["model"].iloc[0]) & (rows["task"] == group["task"].iloc[0])],
                "Efficiency inversion: measured tokens/s per round vs k (rounds that drafted the k their run "
                "chose), and the controller's prediction", err="log95")
        figures.append((f"efficiency_inversion__{suffix}", fig))
    return figures


def _inversion_note(rows: pd.DataFrame, model: str, task: str) -> str:
    """`inversion among fixed k: 2 of 3 contexts`, by the rule of the claims table (`fixed_k_inversion`)."""
    same = with_labels(rows[(rows["model"] == model) & (rows["task"] == task)])
    found = [fixed_k_inversion(cell) for _, cell in same.groupby("ctx", sort=True)]
    found = [f for f in found if f is not None]
    return (f"inversion among fixed k (whole runs, as in the claims table): {sum(found)} of {len(found)} contexts"
            if found else "inversion among fixed k: fewer than two fixed k ran")


def _predicted_panel(ax, rounds: pd.DataFrame) -> None:
    """Mean over controller rounds of (1 + sum_{j<=m} pi_j) / (m C_d + C_v + C_s) for each prefix m."""
    traced = rounds[rounds["survival"].map(len) > 0].dropna(subset=["cost_draft", "cost_verify"]) \
        if not rounds.empty else rounds
    if traced.empty:
        ax.text(0.5, 0.5, "no controller trace (survival, C_d, C_v)\nin these runs",
                ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    curves = [pd.DataFrame({"run": r.run, "prompt_id": r.prompt_id, "m": np.arange(1, len(r.survival) + 1),
                            "ratio": predicted_ratio(r.survival, r.cost_draft, r.cost_verify, r.cost_select)})
              for r in traced.itertuples()]
    per_prompt = pd.concat(curves).groupby(["run", "prompt_id", "m"], as_index=False)["ratio"].mean()
    stats = geometric_across_prompts(per_prompt, ["m"], "ratio")
    ax.errorbar(stats["m"], stats["mean"], yerr=[stats["mean"] - stats["low"], stats["high"] - stats["mean"]],
                marker="s", capsize=3, color="C3", label="predicted (1+Σπ_m)/(k·C_d+C_v)")
    ax.plot([], [], color="0.5", linestyle=":", label="k the prediction favours")
    _mark_best(ax, stats["m"], stats["mean"])
    ax.set_xlabel("draft length k (tokens)")
    ax.set_ylabel("expected tokens / s (controller's model)")
    legend_outside(ax)


def _fit_to_means(ax, stats: pd.DataFrame, headroom: float = 1.5) -> None:
    """Scale the y axis to the means: a k that few rounds of few prompts drafted has an interval
    decades wide (n = 3, t = 4.3), which would flatten every other point onto the axis; its bar is cut
    at the top edge, and the legend says so."""
    top = headroom * float(stats["mean"].max())
    if np.isfinite(top) and top > 0 and (stats["high"] > top).any():
        ax.set_ylim(0, top)
        ax.plot([], [], linestyle="none", label="bars cut at the top: intervals wider than the axis "
                                                "(a k drafted in few rounds)")


def _mark_best(ax, ks, values) -> None:
    values = np.asarray(values, dtype=float)
    if len(values) and np.isfinite(values).any():
        best = int(np.nanargmax(values))
        ax.axvline(np.asarray(ks)[best], color="0.5", linestyle=":", linewidth=1)


FIGURES: dict[str, Callable[[pd.DataFrame], FigureList]] = {
    "speedup_vs_context": speedup_vs_context,
    "acceptance_vs_context": acceptance_vs_context,
    "speedup_vs_depth": speedup_vs_depth,
    "fixed_k_ablation": fixed_k_ablation,
    "budget_ablation": budget_ablation,
    "entropy_distributions": entropy_distributions,
    "entropy_roc": entropy_roc,
    "entropy_trace": entropy_trace,
    "efficiency_inversion": efficiency_inversion,
}
