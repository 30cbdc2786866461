"""The batched benchmark, from a batch sweep's run summaries: throughput and speed-up over batched AR
per batch size, the batched cost-model bound, and the costs split into a per-step part and a
per-sequence part.

    python run.py -m experiment=bench_batch_cpu hydra.sweep.dir=docs/runs/batch     # the sweep
    python -m analysis.batch docs/runs/batch                                         # this

Writes <results>/batch.md (both tables), <results>/figures/batch_scaling.{png,pdf} and the block
between `<!-- batch:begin -->` and `<!-- batch:end -->` in docs/benchmark.md. No number is typed by hand.

Batch size 1 runs take the single-sequence path; their speed-up is the geometric mean over prompts, a
batch's the geometric mean over batches of each batch's throughput ratio to batched AR (both with a
Student-t 95% interval on the log scale, `analysis.estimates`).

The cost split. A batched step reads the weights once for the whole batch and each sequence's KV for
that sequence, so each measured cost is modelled as C(B) = W + B * K: W the per-step part (weights,
launch and Python overheads), K the per-sequence part (KV reads, per-row compute). W and K are fitted
by least squares over the batch sizes measured, for the AR step (C_AR(B) = B / batched AR tokens/s),
the draft step C_d(B) and the verification C_v(B). The cost-model bound at batch size B is then
    tau * C_AR(B) / (s * C_d(B) + C_v(B))     (tau tokens per round, s draft steps per round),
which tends to tau * K_AR / (s * K_d + K_v) as B grows: the large-batch limit, where only the
per-sequence costs count. A sparse draft reads a small KV (K_d << K_AR), so self-speculation keeps
paying at large batch exactly when K dominates W (long contexts).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import estimates
from analysis.frames import distinct
from analysis.load import results_or_exit
from analysis.plots import new_figure
from analysis.publish import report_arguments, write_report
from analysis.tables import ctx_label, order_methods, per_run
from sparsespec import stats
from sparsespec.tables import markdown_table

MARK_BEGIN, MARK_END = "<!-- batch:begin -->", "<!-- batch:end -->"
SETTING = ["model", "task", "hardware", "ctx"]


def run_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Per run: the speed-up over AR as a geometric mean with its 95% interval on the log scale, over
    batches (each batch's throughput ratio, carried by its row 0) or, for batch size 1, over prompts."""
    batched = df["batch_size"].fillna(1) > 1
    ratio = df["batch_speedup_vs_ar"].where(batched, df["speedup_vs_ar"])
    counted = ~batched | (df["batch_row"] == 0)          # one ratio a batch: the rest of its rows repeat it
    records = []
    for run, values in ratio[counted].groupby(df.loc[counted, "run"], sort=False):
        est = estimates.geometric(values)
        records.append({"run": run, "speedup": est.ratio, "speedup_low": est.low, "speedup_high": est.high})
    return pd.DataFrame(records, columns=["run", "speedup", "speedup_low", "speedup_high"]).set_index("run")


def batch_runs(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run with its batch size and the batch-level figures, batch size 1 included (its
    single-sequence metrics stand for the batch's)."""
    runs = per_run(df)
    size = runs["run_batch_size"].fillna(1).astype(int)
    single = size == 1
    pick = lambda batched, alone: runs[batched].where(~single, runs[alone])   # noqa: E731
    speedup = run_speedups(df).reindex(runs["run"]).astype(float)
    return pd.DataFrame({
        **{k: runs[k] for k in (*SETTING, "method")}, "B": size,
        "n": runs["run_n_batches"].where(~single, runs["run_n_prompts"]),
        "tokens_per_s": pick("run_batch_tokens_per_s", "run_tokens_per_s"),
        "ar_tokens_per_s": pick("run_ar_batch_tokens_per_s", "run_ar_tokens_per_s"),
        **{column: speedup[column].to_numpy() for column in ("speedup", "speedup_low", "speedup_high")},
        "bound": pick("run_batch_bound", "run_bound"),
        "latency_s": runs["run_sequence_latency_s_mean"].where(~single, runs["run_decode_s_mean"]),
        "tokens_per_round": runs["run_mean_accepted"], "acceptance": runs["run_acceptance_rate"],
        "draft_steps_per_round": runs["run_draft_steps_per_round"],
        "c_draft_ms": runs["run_c_draft_s"] * 1e3, "c_verify_ms": runs["run_c_verify_s"] * 1e3,
        "outputs_match_ar": runs["run_outputs_match_ar"],
    }).sort_values([*SETTING, "method", "B"], kind="stable").reset_index(drop=True)


def throughput_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per setting, batch size and method: batch tok/s, the speed-up over batched AR with its
    interval, the bound and the share of it reached, per-sequence latency, tokens/round, acceptance."""
    table = runs.assign(reached=runs["speedup"] / runs["bound"],
                        c_ar_ms=runs["B"] / runs["ar_tokens_per_s"] * 1e3)
    table = table[[*SETTING, "B", "method", "n", "tokens_per_s", "speedup", "speedup_low", "speedup_high", "bound",
                   "reached", "latency_s", "tokens_per_round", "acceptance", "c_ar_ms", "c_draft_ms", "c_verify_ms",
                   "outputs_match_ar"]]
    return order_methods(table, setting=(*SETTING, "B"))


def fit_per_step_and_per_sequence(sizes, costs) -> tuple[float, float]:
    """Least-squares W, K of C(B) = W + B * K (NaN when fewer than two batch sizes are measured)."""
    sizes, costs = np.asarray(sizes, dtype=float), np.asarray(costs, dtype=float)
    keep = np.isfinite(costs)
    if len(np.unique(sizes[keep])) < 2:
        return float("nan"), float("nan")
    per_sequence, per_step = np.polyfit(sizes[keep], costs[keep], 1)
    return float(per_step), float(per_sequence)


def cost_split(runs: pd.DataFrame) -> pd.DataFrame:
    """Per setting and speculative method: W and K (ms) of the AR step, the draft step and the
    verification; the modelled bound at the largest batch size measured and its large-batch limit."""
    records = []
    for key, group in runs[runs["method"] != "ar"].groupby([*SETTING, "method"], sort=True):
        group = group.sort_values("B")
        c_ar = group["B"] / group["ar_tokens_per_s"] * 1e3
        w_ar, k_ar = fit_per_step_and_per_sequence(group["B"], c_ar)
        w_d, k_d = fit_per_step_and_per_sequence(group["B"], group["c_draft_ms"])
        w_v, k_v = fit_per_step_and_per_sequence(group["B"], group["c_verify_ms"])
        last = group.iloc[-1]
        tau, steps = last["tokens_per_round"], last["draft_steps_per_round"]
        # the large-batch limit: only the per-sequence parts K remain
        limit = stats.cost_bound(tau, steps, k_ar, k_d, k_v) if np.isfinite(k_d) and k_ar > 0 else float("nan")
        records.append({**dict(zip([*SETTING, "method"], key)), "sizes": ",".join(map(str, group["B"])),
                        "W_ar_ms": w_ar, "K_ar_ms": k_ar, "W_d_ms": w_d, "K_d_ms": k_d, "W_v_ms": w_v, "K_v_ms": k_v,
                        "per_sequence_share_ar_at_max_B": k_ar * last["B"] / (w_ar + k_ar * last["B"]),
                        "speedup_at_max_B": last["speedup"], "bound_at_max_B": last["bound"],
                        "large_batch_limit": limit})
    return pd.DataFrame(records)


def scaling_figure(runs: pd.DataFrame):
    """Speed-up over batched AR (geometric mean, 95% interval on the log scale) against batch size: one
    panel per setting."""
    settings = list(runs.groupby(SETTING, sort=True))
    methods = sorted(set(runs["method"]) - {"ar"})
    colour = {method: f"C{i % 10}" for i, method in enumerate(methods)}     # one colour a method in every panel
    fig, axes = new_figure(ncols=max(1, len(settings)), width=5.0)
    for ax, (key, group) in zip(axes, settings):
        for method, line in group[group["method"] != "ar"].groupby("method", sort=True):
            line = line.sort_values("B")
            err = np.vstack([line["speedup"] - line["speedup_low"], line["speedup_high"] - line["speedup"]])
            ax.errorbar(line["B"], line["speedup"], yerr=np.nan_to_num(err), marker="o", capsize=3, label=method,
                        color=colour[method], linewidth=2.6 if method == "sparsespec" else 1.4)
        ax.axhline(1.0, color="0.3", linestyle="--", linewidth=1, label="batched ar")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(group["B"].unique()))
        ax.set_xticklabels([str(b) for b in sorted(group["B"].unique())])
        ax.set_xlabel("batch size")
        ax.set_ylabel("throughput speed-up over batched AR (×)")
        ax.set_title(f"{key[0]} · {key[1]} · {ctx_label(key[3])}", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(f"Batched decoding: speed-up vs batch size ({', '.join(distinct(runs, 'hardware'))})\n"
                 "geometric mean, error bars: 95% CI on the log scale over batches (B = 1: over prompts)",
                 fontsize=10)
    return fig


def fmt(table: pd.DataFrame) -> pd.DataFrame:
    """Rounded for reading, the speed-up with its interval in one cell (the run summaries keep full
    precision)."""
    out = table.copy()
    if "speedup" in out:
        out["speedup"] = [estimates.from_columns(m, lo, hi, n).text()
                          for m, lo, hi, n in zip(out["speedup"], out["speedup_low"], out["speedup_high"], out["n"])]
        out = out.drop(columns=["speedup_low", "speedup_high"])
    return out.round(3)


def document(runs: pd.DataFrame, results: str) -> tuple[str, str]:
    """(the full Markdown of <results>/batch.md, the block for docs/benchmark.md)."""
    throughput, split = fmt(throughput_table(runs)), cost_split(runs).round(3)
    header = f"<!-- generated by `python -m analysis.batch {results}`; edits here are overwritten -->"
    full = "\n".join([f"# Batched decoding: {results}", header, "",
                      "## Throughput and the bound, per batch size", "", markdown_table(throughput), "",
                      "## Costs split into per-step (W) and per-sequence (K) parts, C(B) = W + B·K", "",
                      markdown_table(split), ""])
    short = throughput[[*SETTING, "B", "method", "tokens_per_s", "speedup", "bound", "reached", "latency_s",
                        "tokens_per_round", "outputs_match_ar"]]
    block = "\n".join([MARK_BEGIN, header, "", markdown_table(short), "",
                       markdown_table(split[[*SETTING, "method", "sizes", "W_ar_ms", "K_ar_ms", "W_d_ms", "K_d_ms",
                                             "W_v_ms", "K_v_ms", "per_sequence_share_ar_at_max_B",
                                             "large_batch_limit"]]), "",
                       f"All columns, and the figure: `{results}/batch.md`, `{results}/figures/batch_scaling.png`.",
                       MARK_END])
    return full, block


def main(argv: list[str] | None = None) -> int:
    args, doc_text = report_arguments(argv, "python -m analysis.batch", __doc__.split("\n")[0],
                                      "docs/runs/batch", "batch.md", MARK_BEGIN, MARK_END)
    runs = batch_runs(results_or_exit(args.results))
    full, block = document(runs, args.results)
    print(write_report(Path(args.results), "batch.md", full, scaling_figure(runs), "batch_scaling",
                       args.doc, doc_text, block, MARK_BEGIN, MARK_END))
    return 0


if __name__ == "__main__":
    sys.exit(main())
