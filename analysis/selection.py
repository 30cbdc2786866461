"""Recycled top-K against simpler sparse drafts across draft budgets, from a budget sweep's run
summaries (issue #13's selection lever): acceptance and speed-up per budget, the paired comparison at
the same budget, and each draft at its own best budget.

    python run.py experiment=selection_budget_cpu hydra.sweep.dir=docs/runs/selection_budget/qwen_8k_k4
    python run.py experiment=selection_budget_cpu selection_k=16 hydra.sweep.dir=docs/runs/selection_budget/qwen_8k_k16
    python -m analysis.selection docs/runs/selection_budget

Writes <results>/selection.md, <results>/figures/selection_budget.{png,pdf} and the block between
`<!-- selection:begin -->` and `<!-- selection:end -->` in docs/benchmark.md. No number is typed by hand.

Every draft of a cell runs at the same fixed k, so tokens per round differ only by which KV positions the draft
attends to. Comparisons are paired as in analysis.claims: per prompt, recycled top-K's decode tokens/s
over the other draft's, both decoded in one process from one shared prefill; "ahead" where the 95%
interval of the ratios' geometric mean lies above 1, "behind" below 1, "tied" otherwise. Every speed-up and
ratio is a geometric mean over prompts with its Student-t 95% interval on the log scale (`analysis.estimates`).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from analysis import estimates
from analysis.claims import paired_ratio, standing
from analysis.frames import RECYCLED, SELECTION_CELL, percent, selection_samples
from analysis.load import results_or_exit
from analysis.provenance import PoolingError, check_poolable
from analysis.publish import report_arguments, write_report
from analysis.tables import ctx_label
from sparsespec.tables import markdown_table

MARK_BEGIN, MARK_END = "<!-- selection:begin -->", "<!-- selection:end -->"


def budget_table(s: pd.DataFrame) -> pd.DataFrame:
    """Per cell, draft and budget: prompts, tokens per round, the speed-up over AR (geometric mean, 95%
    interval on the log scale), and the run's measured costs: a draft step, a verification and the
    selection per round (ms)."""
    records = []
    for key, rows in s.groupby([*SELECTION_CELL, "draft", "budget_frac"], sort=True):
        speedup = estimates.geometric(rows["speedup_vs_ar"])
        records.append({**dict(zip([*SELECTION_CELL, "draft", "budget"], key)), "n": len(rows),
                        "tokens_per_round": rows["mean_accepted"].mean(), "speedup_vs_ar": speedup.ratio,
                        "low": speedup.low, "high": speedup.high,
                        "c_draft_ms": rows["run_c_draft_s"].mean() * 1e3,
                        "c_verify_ms": rows["run_c_verify_s"].mean() * 1e3,
                        "select_ms": rows["run_select_s_per_round"].mean() * 1e3,
                        "outputs_match_ar": bool(rows["outputs_match_ar"].astype(bool).all())})
    return pd.DataFrame(records)


def same_budget_table(s: pd.DataFrame) -> pd.DataFrame:
    """Per cell and budget, recycled top-K (recent window at its default) against every other draft
    run at that budget, over the prompts both decoded: tokens per round of both, on how many prompts
    top-K's was higher, and the paired tokens/s ratio."""
    records = []
    for key, rows in s.groupby([*SELECTION_CELL, "budget_frac"], sort=True):
        if RECYCLED not in set(rows["draft"]):
            continue
        mine = rows[rows["draft"] == RECYCLED]
        for other in sorted(set(rows["draft"]) - {RECYCLED}):
            theirs = rows[rows["draft"] == other]
            ci = paired_ratio(rows, mine["label"].iloc[0], theirs["label"].iloc[0])
            # under greedy, tokens per round are deterministic: on how many prompts did top-K accept more?
            accepted = pd.merge(mine, theirs, on="prompt_id", suffixes=("_mine", "_theirs"))
            more = int((accepted["mean_accepted_mine"] > accepted["mean_accepted_theirs"]).sum())
            records.append({**dict(zip([*SELECTION_CELL, "budget"], key)), "vs": other, "prompts": len(accepted),
                            "tokens/round (top-K)": accepted["mean_accepted_mine"].mean(),
                            "tokens/round (other)": accepted["mean_accepted_theirs"].mean(),
                            "top-K accepts more on": f"{more} of {len(accepted)} prompts",
                            "top-K / other": ci.text(), "standing": standing(ci)})
    return pd.DataFrame(records)


def best_budget_table(s: pd.DataFrame) -> pd.DataFrame:
    """Per cell, each draft at the budget where its speed-up (geometric mean over prompts) was highest, and
    recycled top-K at its best against each other draft at its own best (paired over the prompts both
    decoded)."""
    records = []
    for key, rows in s.groupby(SELECTION_CELL, sort=True):
        means = rows.groupby(["draft", "budget_frac"])["speedup_vs_ar"].agg(lambda v: estimates.geometric(v).ratio)
        best = {draft: means[draft].idxmax() for draft in means.index.get_level_values(0).unique()}
        if RECYCLED not in best:
            continue
        label = lambda draft: f"{draft} b={percent(best[draft])}"     # noqa: E731
        for other in sorted(set(best) - {RECYCLED}):
            ci = paired_ratio(rows, label(RECYCLED), label(other))
            records.append({**dict(zip(SELECTION_CELL, key)), "vs": other, "top-K best budget": best[RECYCLED],
                            "top-K speed-up": means[RECYCLED, best[RECYCLED]], "other best budget": best[other],
                            "other speed-up": means[other, best[other]], "top-K / other": ci.text(),
                            "standing": standing(ci)})
    return pd.DataFrame(records)


def budget_figure(table: pd.DataFrame):
    """Per cell: tokens per round (top) and speed-up over AR (geometric mean, 95% interval on the log
    scale; bottom) against the draft budget, one line per draft."""
    cells = list(table.groupby(SELECTION_CELL, sort=True))
    drafts = sorted(table["draft"].unique())
    colour = {draft: f"C{i % 10}" for i, draft in enumerate(drafts)}
    fig = Figure(figsize=(4.6 * max(1, len(cells)), 7.6), layout="constrained")
    axes = fig.subplots(2, max(1, len(cells)), squeeze=False)
    for col, (key, group) in enumerate(cells):
        for draft, line in group.groupby("draft", sort=True):
            line = line.sort_values("budget")
            style = dict(marker="o", color=colour[draft], label=draft, linewidth=2.4 if draft == RECYCLED else 1.4)
            axes[0, col].plot(line["budget"] * 100, line["tokens_per_round"], **style)
            err = np.vstack([line["speedup_vs_ar"] - line["low"], line["high"] - line["speedup_vs_ar"]])
            axes[1, col].errorbar(line["budget"] * 100, line["speedup_vs_ar"], yerr=np.nan_to_num(err.astype(float)),
                                  capsize=3, **style)
        axes[0, col].set_title(f"{key[0]} · {key[1]} · {ctx_label(key[2])} · k = {key[3]}", fontsize=9)
        axes[0, col].set_ylabel(f"tokens per round (at most {key[3] + 1})")
        axes[0, col].set_ylim(1, key[3] + 1.2)          # the full range: a saturated draft reads as one
        axes[1, col].axhline(1.0, color="0.3", linestyle="--", linewidth=1)
        axes[1, col].set_ylabel("decode speed-up over AR (×)")
        for row in (0, 1):
            axes[row, col].set_xscale("log")
            axes[row, col].minorticks_off()
            ticks = sorted(group["budget"].unique() * 100)
            axes[row, col].set_xticks(ticks)
            axes[row, col].set_xticklabels([f"{t:g}%" for t in ticks])
            axes[row, col].set_xlabel("draft budget (% of the context)")
        axes[0, col].legend(fontsize=7)
    fig.suptitle("Draft selection across budgets: recycled top-K against a recent window\n"
                 "speed-up: geometric mean over prompts, error bars: 95% CI on the log scale", fontsize=10)
    return fig


def fmt(table: pd.DataFrame) -> pd.DataFrame:
    out = table.copy()
    if "speedup_vs_ar" in out:
        out["speedup_vs_ar"] = [estimates.from_columns(m, lo, hi, n).text() for n, m, lo, hi
                                in zip(out["n"], out["speedup_vs_ar"], out["low"], out["high"])]
        out = out.drop(columns=["low", "high"])
    for column in [c for c in out.columns if "budget" in c]:
        out[column] = [percent(b) for b in out[column]]
    return out.round(2)


def document(s: pd.DataFrame, results: str) -> tuple[str, str]:
    """(the Markdown of <results>/selection.md, the block for docs/benchmark.md)."""
    per_budget, same, best = fmt(budget_table(s)), same_budget_table(s).round(2), fmt(best_budget_table(s))
    header = f"<!-- generated by `python -m analysis.selection {results}`; edits here are overwritten -->"
    sections = ["## Recycled top-K against each other draft at the same budget (paired tokens/s)", "",
                markdown_table(fmt(same)), "",
                "## Each draft at its own best budget", "", markdown_table(best), "",
                "## Every draft and budget", "", markdown_table(per_budget), ""]
    full = "\n".join([f"# Draft selection across budgets: {results}", header, "", *sections])
    block = "\n".join([MARK_BEGIN, header, "", *sections[:-1],
                       f"The figure: `{results}/figures/selection_budget.png`.", MARK_END])
    return full, block


def main(argv: list[str] | None = None) -> int:
    args, doc_text = report_arguments(argv, "python -m analysis.selection", __doc__.split("\n")[0],
                                      "docs/runs/selection_budget", "selection.md", MARK_BEGIN, MARK_END,
                                      mixed_commits_flag=True)
    s = selection_samples(results_or_exit(args.results))
    try:   # a prompt twice in a cell, a speed that is not positive, a cell of mixed code: as analysis.claims refuses
        check_poolable(s, args.allow_mixed_commits, SELECTION_CELL)
    except PoolingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    full, block = document(s, args.results)
    print(write_report(Path(args.results), "selection.md", full, budget_figure(budget_table(s)), "selection_budget",
                       args.doc, doc_text, block, MARK_BEGIN, MARK_END))
    return 0


if __name__ == "__main__":
    sys.exit(main())
