"""The paper's tables from the tidy results DataFrame: the method comparison (main-table style),
the measured costs and the cost-model bound, and "paper vs measured". Every number is a run's own
summary.json metric (`sparsespec.stats` defines them); tables are written by `sparsespec.tables`."""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import paper
from analysis.estimates import geometric
from analysis.frames import select_experiment, with_labels
from sparsespec.tables import markdown_table

METHOD_TABLE_COLUMNS = ["model", "task", "source", "hardware", "ctx", "method", "runs", "n_prompts", "tokens_per_s",
                        "ar_tokens_per_s", "speedup", "speedup_ci95_low", "speedup_ci95_high", "log_speedup_std",
                        "acceptance_rate", "mean_accepted", "outputs_match_ar"]
RUN_METRICS = {"tokens_per_s": "run_tokens_per_s", "ar_tokens_per_s": "run_ar_tokens_per_s",
               "acceptance_rate": "run_acceptance_rate", "mean_accepted": "run_mean_accepted"}
SETTING_KEYS = ["model", "task", "source", "hardware", "ctx", "method"]


def per_run(df: pd.DataFrame) -> pd.DataFrame:
    """One row per run: its setting, the pooled metrics of its summary.json, and `drafted`, the draft
    tokens its rounds verified (0: acceptance is undefined, not 0%)."""
    drafted = df.groupby("run")["rounds"].agg(lambda samples: sum(int(r.get("drafted") or 0)
                                                                  for rounds in samples for r in rounds or []))
    runs = with_labels(df.drop_duplicates("run"))
    runs["method"] = runs["label"]
    runs["drafted"] = runs["run"].map(drafted)
    return runs.drop(columns="label")


def method_comparison(df: pd.DataFrame) -> pd.DataFrame:
    """Main-table style: pooled tok/s, speedup, acceptance and mean accepted length per setting and
    method. The speed-up over AR is the geometric mean of the prompts' speed-ups with its Student-t 95%
    interval on the log scale (`analysis.estimates.geometric`) and the standard deviation of their logs,
    over every prompt of the setting's runs; every other value is the run's own summary.json metric
    (the mean over runs when one setting was run several times, e.g. seeds)."""
    runs = per_run(select_experiment(df, ("method_comparison",)))
    records = []
    for key, group in runs.groupby(SETTING_KEYS, dropna=False, sort=True):
        record = dict(zip(SETTING_KEYS, key))
        record["runs"] = len(group)
        record["n_prompts"] = int(group["run_n_prompts"].fillna(0).sum())
        record.update({name: group[column].mean() for name, column in RUN_METRICS.items()})
        record.update(speedup_columns(df.loc[df["run"].isin(group["run"]), "speedup_vs_ar"]))
        record["outputs_match_ar"] = group["run_outputs_match_ar"].mean()   # fraction of prompts
        if not group["drafted"].sum():               # nothing drafted (transformers' generate, an idle pld)
            record["acceptance_rate"] = math.nan
        if record["method"] == "ar":                 # the reference itself; it drafts nothing
            record["speedup"] = 1.0 if math.isnan(record["speedup"]) else record["speedup"]
            record["speedup_ci95_low"] = record["speedup_ci95_high"] = record["speedup"]
            record["acceptance_rate"] = math.nan
        records.append(record)
    table = pd.DataFrame(records, columns=METHOD_TABLE_COLUMNS)
    return order_methods(table)


def speedup_columns(speedups: pd.Series) -> dict:
    """speedup, speedup_ci95_low/high (geometric mean, log-scale 95% interval; NaN without one) and
    log_speedup_std (the spread of the log ratios; NaN below two prompts)."""
    logs = np.log(speedups.dropna().astype(float))
    return {**dict(zip(("speedup", "speedup_ci95_low", "speedup_ci95_high"), geometric(speedups).columns())),
            "log_speedup_std": logs.std() if len(logs) > 1 else math.nan}


# ---------------------------------------------------------------- measured costs

SPEEDUP_COLUMNS = ("speedup", "speedup_ci95_low", "speedup_ci95_high")
COST_METRICS = {"mean_accepted": "run_mean_accepted",
                "outputs_match_ar": "run_outputs_match_ar", "c_ar_ms": "run_c_ar_s", "c_draft_ms": "run_c_draft_s",
                "c_verify_ms": "run_c_verify_s", "draft_steps_per_round": "run_draft_steps_per_round",
                "select_ms_per_round": "run_select_s_per_round", "bound": "run_bound",
                "bound_reached": "run_bound_reached", "prefill_s": "run_prefill_s_mean"}
MILLISECONDS = ("c_ar_ms", "c_draft_ms", "c_verify_ms", "select_ms_per_round")


def measured_costs(df: pd.DataFrame) -> pd.DataFrame:
    """Per setting and method: the speed-up (geometric mean over the setting's prompts, 95% interval
    on the log scale, as in `method_comparison`: recomputed from the samples, since older summaries
    hold arithmetic means), the measured costs C_AR (AR seconds per token), C_d (seconds per draft
    step), C_v (verify seconds per round) and select+gather per round, in ms, and the cost-model
    bound with the share of it reached (the runs' summary.json values, the mean over runs; the side-by-side
    benchmark's table)."""
    runs = per_run(df)
    records = []
    for key, group in runs.groupby(SETTING_KEYS, dropna=False, sort=True):
        record = {**dict(zip(SETTING_KEYS, key)), "runs": len(group)}
        speedup = speedup_columns(df.loc[df["run"].isin(group["run"]), "speedup_vs_ar"])
        record.update({name: speedup[name] for name in SPEEDUP_COLUMNS})
        record.update({name: group[column].mean() for name, column in COST_METRICS.items()})
        record.update({name: record[name] * 1e3 for name in MILLISECONDS})
        records.append(record)
    return order_methods(pd.DataFrame(records, columns=[*SETTING_KEYS, "runs", *SPEEDUP_COLUMNS, *COST_METRICS]))


def order_methods(table: pd.DataFrame, setting: tuple[str, ...] = ("model", "task", "ctx")) -> pd.DataFrame:
    """ar first, then sparsespec, then the rest alphabetically, within each `setting`."""
    rank = table["method"].map(lambda m: 0 if m == "ar" else 1 if m == "sparsespec" else 2)
    return (table.assign(_rank=rank).sort_values([*setting, "_rank", "method"], kind="stable")
            .drop(columns="_rank").reset_index(drop=True))


# ---------------------------------------------------------------- paper vs measured

PAPER_VS_MEASURED_COLUMNS = ["table", "paper_method", "method", "paper_tokens_per_s", "measured_tokens_per_s",
                             "paper_speedup", "measured_speedup", "paper_acceptance_rate",
                             "measured_acceptance_rate", "paper_mean_accepted", "measured_mean_accepted",
                             "measured_model", "measured_task", "measured_source", "measured_ctx",
                             "measured_hardware",
                             "differs"]


def _norm(text: object) -> str:
    return re.sub(r"[^a-z0-9]", "", str(text).lower())


def differing_settings(measured: dict, reference: dict) -> str:
    """Which of model, hardware, context, benchmark differ from the reported setting (`reference`,
    see analysis.paper); a setting the reference leaves unstated is not compared."""
    differs = []
    if _norm(reference["model"]) not in _norm(measured["model"]):
        differs.append(f"model ({measured['model']} vs {reference['model']})")
    if reference.get("hardware") and _norm(reference["hardware"]) not in _norm(measured["hardware"]):
        differs.append(f"hardware ({measured['hardware']} vs {reference['hardware']})")
    ctx = measured["ctx"]
    if not ctx or math.isnan(ctx) or abs(ctx - reference["ctx"]) / reference["ctx"] > 0.1:
        differs.append(f"context ({ctx_label(ctx)} vs {ctx_label(reference['ctx'])})")
    benchmark = f"{measured['task']}/{measured['source']}"
    if not any(_norm(key) in _norm(benchmark) for key in reference["benchmark_keys"]):
        differs.append(f"benchmark ({benchmark} vs {reference['benchmark']})")
    return "; ".join(differs) if differs else "none"


def ctx_label(ctx: float) -> str:
    """A context length as the configs name it: 16000 -> "16K", 4096 -> "4.096K"; "?" when unknown."""
    return f"{ctx / 1000:g}K" if ctx and not math.isnan(ctx) else "?"


def comparison_settings(measured: pd.DataFrame) -> list[tuple]:
    """The (model, task, source, hardware, ctx) to compare with the paper: per model x task x
    hardware, the longest context at which SparseSpec-L was measured (the paper's is its longest)."""
    ours = measured[measured["method"] == "sparsespec"]
    ours = ours if not ours.empty else measured
    settings = []
    for key, group in ours.groupby(["model", "task", "source", "hardware"], sort=True, dropna=False):
        settings.append((*key, group["ctx"].max()))
    return settings


def paper_vs_measured(df: pd.DataFrame) -> pd.DataFrame:
    """The reported numbers (analysis.paper) beside the measured ones for the closest setting, with
    the settings that differ named. Every paper row is kept; unmeasured values are NaN."""
    measured = method_comparison(df)
    settings = comparison_settings(measured) or [(None, None, None, None, math.nan)]
    records = []
    for setting in settings:
        records += _main_table_rows(measured, setting) + _fixed_k_rows(measured, setting)
        records.append(_brief_row(measured, setting))
    return pd.DataFrame(records, columns=PAPER_VS_MEASURED_COLUMNS)


def _measured_row(measured: pd.DataFrame, setting: tuple, method: str | None) -> dict:
    model, task, source, hardware, ctx = setting
    rows = measured[(measured["model"] == model) & (measured["task"] == task) & (measured["source"] == source)
                    & (measured["hardware"] == hardware) & (measured["ctx"] == ctx) & (measured["method"] == method)]
    return rows.iloc[0].to_dict() if len(rows) else {}


def _row(table: str, paper_method: str, method: str | None, reported: dict, got: dict, setting: tuple,
         reference: dict) -> dict:
    model, task, source, hardware, ctx = setting
    where = {"model": model, "task": task, "source": source, "hardware": hardware, "ctx": ctx}
    return {"table": table, "paper_method": paper_method, "method": method or "(not implemented)",
            **{f"paper_{q}": reported.get(q) for q in ("tokens_per_s", "speedup", "acceptance_rate",
                                                      "mean_accepted")},
            **{f"measured_{q}": got.get(q, np.nan) for q in ("tokens_per_s", "speedup", "acceptance_rate",
                                                            "mean_accepted")},
            **{f"measured_{k}": v for k, v in where.items()},
            "differs": differing_settings(where, reference) if model else "not measured"}


def _main_table_rows(measured: pd.DataFrame, setting: tuple) -> list[dict]:
    return [_row("main (LongBench v2)", entry["paper_method"], entry["method"], entry,
                 _measured_row(measured, setting, entry["method"]) if entry["method"] else {},
                 setting, paper.SETTING) for entry in paper.MAIN_TABLE]


def _fixed_k_rows(measured: pd.DataFrame, setting: tuple) -> list[dict]:
    rows = []
    for k, speedup in paper.FIXED_K_SPEEDUP.items():
        method = "sparsespec" if k is None else f"sparsespec_fixed k={k}"
        name = "controller" if k is None else f"fixed k={k}"
        rows.append(_row("fixed-k ablation", name, method, {"speedup": speedup},
                         _measured_row(measured, setting, method), setting, paper.SETTING))
    return rows


def _brief_row(measured: pd.DataFrame, setting: tuple) -> dict:
    claim = paper.BRIEF_CLAIM
    reference = {**paper.SETTING, **claim}
    return _row("project brief", f"SparseSpec-L, up to {claim['speedup']}x at 60K", "sparsespec",
                {"speedup": claim["speedup"]}, _measured_row(measured, setting, "sparsespec"), setting,
                reference)


# ---------------------------------------------------------------- writing

def to_markdown(table: pd.DataFrame) -> str:
    """The table in GitHub Markdown (`sparsespec.tables.markdown_table`); NaN/None print as '–'."""
    return markdown_table(table) + "\n"


def write_table(table: pd.DataFrame, out_dir: Path, stem: str) -> list[Path]:
    """`stem`.csv, .md and (when jinja2 is importable) .tex under `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.csv", out_dir / f"{stem}.md"]
    table.to_csv(paths[0], index=False)
    paths[1].write_text(to_markdown(table))
    try:
        latex = table.to_latex(index=False, float_format="%.3g", na_rep="--")
    except ImportError as error:                   # pandas' LaTeX writer needs jinja2
        print(f"note: {stem}.tex skipped ({error})")
        return paths
    paths.append(out_dir / f"{stem}.tex")
    paths[2].write_text(latex)
    return paths


def experiment_costs(df: pd.DataFrame) -> pd.DataFrame:
    """What each experiment cost here: jobs, runs, prompts and wall time per experiment and hardware.
    A job's wall time is its start to end (model loading, warm-up, prefill and every method's decoding);
    the methods of one benchmark job share it, so each job is counted once, not once per method."""
    runs = df.drop_duplicates("run").assign(experiment=lambda d: d["experiment"].fillna("(none)"),
                                            job=lambda d: d["job"].fillna(d["run"]))
    jobs = runs.groupby(["experiment", "hardware", "job"], sort=True).agg(
        runs=("run", "size"), prompts=("run_n_prompts", "max"), wall_s=("run_wall_s", "max")).reset_index()
    table = jobs.groupby(["experiment", "hardware"], sort=True).agg(
        jobs=("job", "size"), runs=("runs", "sum"), prompts=("prompts", "sum"), wall_s_total=("wall_s", "sum"),
        wall_s_mean=("wall_s", "mean"), wall_s_max=("wall_s", "max")).reset_index()
    table["wall_min_total"] = table["wall_s_total"] / 60
    return table


TABLES = {"method_comparison": method_comparison, "measured_costs": measured_costs,
          "paper_vs_measured": paper_vs_measured, "experiment_costs": experiment_costs}
