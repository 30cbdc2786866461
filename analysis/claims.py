"""The paper's claims, each checked against the committed CPU matrix: every ratio on the log scale
(geometric means), pooled over cells with cells as blocks, and a three-way verdict.

    python -m analysis.claims <results>                      # <results>/claims.md and <results>/figures
    python -m analysis.claims docs/runs/matrix --publish     # also docs/claims.md and the README's block
    python -m analysis.claims docs/runs/matrix --selection docs/runs/selection_budget --publish   # + k=16 selection

Without `--publish` nothing outside the results folder is written. With it, `docs/claims.md` (each
claim with its pooled estimates and its evidence per cell) and the README's results block between the
`<!-- claims:begin -->` and `<!-- claims:end -->` markers are rewritten too. Every input (the results,
the README's markers, the runs' provenance) is checked before anything is written. This module computes
the verdicts; `analysis.publish` writes them.

Comparisons between two methods are *paired*: per prompt, method A's decode tokens/s over method B's,
both decoded in the same process from the same shared prefill. Per cell, the ratios' geometric mean
gets a Student-t 95% interval on the log scale; pooled over cells, a mixed model with cells as blocks
(`analysis.estimates`). A claim is reproduced when its pooled interval lies on the claimed side of 1,
contradicted only when it lies wholly on the other side, and inconclusive otherwise.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis import estimates, publish
from analysis.estimates import NOT_MEASURABLE, Estimate, combined_verdict
from analysis.frames import (RECYCLED, RETRIEVAL, SELECTION_CELL, distinct, fixed_k_inversion, percent,
                             selection_samples, with_labels)
from analysis.load import results_or_exit
from analysis.provenance import (PoolingError, add_mixed_commits_flag, cell_provenance, check_poolable,
                                 duplicate_prompts)
from analysis.tables import ctx_label

CONTROLLER = "sparsespec"
FIXED_K = ("sparsespec_fixed k=4", "sparsespec_fixed k=8", "sparsespec_fixed k=16")
SAME_K = 4                                        # streaming's and SnapKV's default k
SAME_K_RECYCLED = f"{RECYCLED} k={SAME_K}"       # recycled top-K at their default k and budget
SIMPLER_DRAFTS = ("streaming", "snapkv_static")
SELECTION_K = 16                                  # where a selection's misses compound: at k=4 every draft accepts ~5 of 5
SELECTION_BUDGETS = (0.05, 0.1)                   # 5% and the matrix's default 10%: where the drafts' selections differ
OTHER_DRAFTERS = ("layerskip", "assisted")
LONG_CONTEXT = 20_000                             # "beyond 20K": the paper's long-context comparisons
CELL = ["model", "task", "ctx"]
CLAIMED_TASKS = ("summarization", "qa", "code")   # "holds across tasks": the paper's three; others show beside them


@dataclass
class Claim:
    claim: str
    verdict: str                    # reproduced | contradicted | inconclusive | not measurable here
    summary: str                    # one sentence naming each deciding estimate, its interval and its n
    evidence: pd.DataFrame = field(default_factory=pd.DataFrame)      # per cell
    pooled: pd.DataFrame = field(default_factory=pd.DataFrame)        # the estimates the verdict rests on


# ------------------------------------------------------------------------------------ frames

def samples(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (cell, method label, prompt) with its decode tokens/s and speed-up over AR.
    A prompt decoded twice by one method in one cell (a cell run twice, on two machines) is a
    PoolingError: pairing and intervals would silently pool the two."""
    out = with_labels(df)
    out["ctx"] = out["ctx"].astype(int)
    problem = duplicate_prompts(out)
    if problem:
        raise PoolingError(problem)
    return out.reindex(columns=[*CELL, "label", "method", "k", "prompt_id", "tokens_per_s", "speedup_vs_ar",
                                "outputs_match_ar", "mean_accepted", "score", "depth"])   # no score/depth: NaN


def speedup_ci(rows: pd.DataFrame, label: str) -> Estimate:
    """Geometric mean speed-up over AR of `label` in one cell, with its 95% interval."""
    return estimates.geometric(rows.loc[rows["label"] == label, "speedup_vs_ar"])


def paired(rows: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Per cell and prompt both decoded: tokens/s of `a` over `b` (`ratio`), with the cell's name."""
    both = rows[rows["label"].isin([a, b])].pivot_table(index=[*CELL, "prompt_id"], columns="label",
                                                        values="tokens_per_s")
    if a not in both or b not in both:
        return pd.DataFrame(columns=[*CELL, "prompt_id", "ratio", "cell"])
    both = both[[a, b]].dropna().reset_index()
    both["ratio"] = both[a] / both[b]
    both["cell"] = [f"{m}/{t}/{c}" for m, t, c in zip(both["model"], both["task"], both["ctx"])]
    return both[[*CELL, "prompt_id", "ratio", "cell"]]


def paired_ratio(rows: pd.DataFrame, a: str, b: str) -> Estimate:
    """Geometric mean over prompts of `a`'s tokens/s over `b`'s, over the prompts both decoded (one cell)."""
    return estimates.geometric(paired(rows, a, b)["ratio"])


def pooled_ratio(rows: pd.DataFrame, a: str, b: str) -> Estimate:
    """`a` over `b` pooled over every cell of `rows` that ran both (cells as blocks)."""
    pairs = paired(rows, a, b)
    return estimates.pooled(pairs["ratio"], pairs["cell"]) if len(pairs) else estimates.NONE


def standing(ci: Estimate) -> str:
    """ahead (interval above 1), behind (below 1), tied; without an interval, the side of the estimate."""
    if ci.ratio is None:
        return "–"
    if ci.low is None:
        return "ahead" if ci.ratio > 1 else "behind"
    return "ahead" if ci.low > 1 else "behind" if ci.high < 1 else "tied"


def cells(s: pd.DataFrame):
    for key, rows in s.groupby(CELL, sort=True):
        yield dict(zip(CELL, key)), rows


def pooled_row(what: str, est: Estimate, **extra) -> dict:
    """One line of a claim's pooled table: the estimate, its interval, its n, p and verdict."""
    return {"comparison": what, **extra, "estimate [95% CI]": est.text(), "n": est.sample(),
            "p": "–" if est.p is None else f"{est.p:.2g}", "fit": est.how or "–", "verdict": est.verdict()}


def named(what: str, est: Estimate) -> str:
    """`what 1.06× [1.01, 1.11] (n = 54 prompts in 18 cells)`: a verdict's estimate, interval and n."""
    return f"{what} {est.text()} ({est.sample()})"


# ------------------------------------------------------------------------------------ claims

def claim_context_growth(s: pd.DataFrame) -> Claim:
    """The slope of log speed-up over AR against log2 context: per model and task (cells as blocks),
    per model (tasks as blocks, cells nested) and pooled (model/task series as blocks, cells nested)."""
    claim = "The speed-up grows with context length"
    rows = s[s["label"] == CONTROLLER]
    series = rows["model"] + "/" + rows["task"]
    cell = series + "/" + rows["ctx"].astype(str)
    records, pooled = [], []
    contexts = {ctx_label(ctx): "–" for ctx in sorted(rows["ctx"].unique())}     # every series, in context order
    for (model, task), r in rows.groupby(["model", "task"], sort=True):
        by_ctx = {ctx_label(ctx): estimates.geometric(g["speedup_vs_ar"]).text() for ctx, g in r.groupby("ctx")}
        slope = estimates.context_slope(r["speedup_vs_ar"], r["ctx"], cell[r.index])
        records.append({"model": model, "task": task, **contexts, **by_ctx, "per doubling of context": slope.text(),
                        "n": slope.sample(), "verdict": slope.verdict()})
    for model, r in rows.groupby("model", sort=True):
        pooled.append(pooled_row(f"{model}, per doubling", estimates.context_slope(
            r["speedup_vs_ar"], r["ctx"], r["task"], cell[r.index])))
    overall = estimates.context_slope(rows["speedup_vs_ar"], rows["ctx"], series, cell) if len(rows) else estimates.NONE
    pooled.append(pooled_row("every model and task, per doubling", overall))
    if overall.ratio is None:
        return Claim(claim, NOT_MEASURABLE, "no model was run at enough contexts to fit a slope",
                     pd.DataFrame(records), pd.DataFrame(pooled))
    return Claim(claim, overall.verdict(),
                 named("SparseSpec-L's speed-up over AR changes per doubling of context by", overall)
                 + ", pooled over model/task series", pd.DataFrame(records), pd.DataFrame(pooled))


def exact_match(rows: pd.DataFrame, label: str) -> str:
    """`label`'s exact-match accuracy (mean score) beside AR's over the prompts of `rows` both decoded:
    `80% (AR 80%, 10 prompts)`; `–` without scores."""
    def scores(who: str) -> pd.Series:
        return rows[rows["label"] == who].set_index(["model", "ctx", "prompt_id"])["score"].dropna()
    mine, ar = scores(label), scores("ar")
    both = mine.index.intersection(ar.index)
    if both.empty:
        return "–"
    return f"{mine[both].mean():.0%} (AR {ar[both].mean():.0%}, {len(both)} prompts)"


def claim_across_tasks(s: pd.DataFrame) -> Claim:
    """Per task, the speed-up over AR pooled over each model's longest-context cell of that task; judged on
    the paper's three tasks, the retrieval task shown beside them with its exact-match accuracy
    (SparseSpec-L's and AR's on the same prompts)."""
    claim = "It holds across summarization, QA and code"
    rows = s[s["label"] == CONTROLLER]
    longest = rows[rows["ctx"] == rows.groupby("model")["ctx"].transform("max")]
    every_method = s.merge(longest[CELL].drop_duplicates(), on=CELL)      # AR's scores at those cells too
    shows_accuracy = RETRIEVAL in set(longest["task"])

    def accuracy(cell_rows: pd.DataFrame, task: str) -> dict:
        """The `exact match` column, present only when the retrieval task is."""
        if not shows_accuracy:
            return {}
        return {"exact match": exact_match(cell_rows, CONTROLLER) if task == RETRIEVAL else "–"}

    records = [{**cell, "speed-up vs AR": est.text(), "n": est.n, "standing vs 1": standing(est),
                **accuracy(every_method.merge(pd.DataFrame([cell]), on=CELL), cell["task"])}
               for cell, r in cells(longest) for est in [speedup_ci(r, CONTROLLER)]]
    pooled = {task: estimates.pooled(r["speedup_vs_ar"], r["model"] + "/" + r["ctx"].astype(str))
              for task, r in longest.groupby("task", sort=True)}
    table = pd.DataFrame([pooled_row(f"{task}, speed-up over AR at each model's longest context", est)
                          | accuracy(every_method[every_method["task"] == task], task)       # beside the speed
                          for task, est in pooled.items()])
    missing = [task for task in CLAIMED_TASKS if task not in pooled]
    if missing:
        return Claim(claim, NOT_MEASURABLE, f"the matrix lacks {' and '.join(missing)}", pd.DataFrame(records), table)
    judged = [task for task in pooled if task in CLAIMED_TASKS]
    beside = [f"{named(f'{RETRIEVAL} (beside the claim):', pooled[RETRIEVAL])}, exact match "
              f"{exact_match(every_method[every_method['task'] == RETRIEVAL], CONTROLLER)}"] if shows_accuracy else []
    return Claim(claim, combined_verdict([pooled[task].verdict() for task in judged]),
                 "; ".join([*(named(f"{task}:", pooled[task]) for task in judged), *beside])
                 + ", each pooled over the models' longest contexts", pd.DataFrame(records), table)


def claim_beats_other_drafters(s: pd.DataFrame) -> Claim:
    claim = "It beats LayerSkip-style and assisted drafting beyond 20K"
    records = [{**cell, "vs": other, "SparseSpec-L / other": est.text(), "standing": standing(est)}
               for cell, rows in cells(s) if CONTROLLER in set(rows["label"])
               for other in OTHER_DRAFTERS if other in set(rows["label"])
               for est in [paired_ratio(rows, CONTROLLER, other)]]
    table = pd.DataFrame(records)
    long = s[s["ctx"] >= LONG_CONTEXT]
    pooled = {other: pooled_ratio(long, CONTROLLER, other) for other in OTHER_DRAFTERS}
    pooled_table = pd.DataFrame([pooled_row(f"SparseSpec-L / {o} at {ctx_label(LONG_CONTEXT)} or more", e)
                                 for o, e in pooled.items()])
    missing = [o for o, e in pooled.items() if e.ratio is None]
    if missing:
        shown = f" (the cells below are shorter: up to {ctx_label(table['ctx'].max())})" if not table.empty else ""
        return Claim(claim, NOT_MEASURABLE,
                     f"no cell at {ctx_label(LONG_CONTEXT)} or more ran {' or '.join(missing)} beside SparseSpec-L{shown}",
                     table, pooled_table)
    return Claim(claim, combined_verdict([e.verdict() for e in pooled.values()]),
                 "; ".join(named(f"SparseSpec-L / {o}", e) for o, e in pooled.items())
                 + f", pooled over the cells at {ctx_label(LONG_CONTEXT)} or more", table, pooled_table)


def claim_controller(s: pd.DataFrame) -> Claim:
    """The controller against each fixed k, pooled over every cell that ran both; per cell, against each
    fixed k and whether a longer fixed k accepted more yet ran slower (the efficiency inversion)."""
    claim = "The entropy controller beats every fixed k and avoids the efficiency inversion"
    records = []
    for cell, rows in cells(s):
        present = [k for k in FIXED_K if k in set(rows["label"])]
        if CONTROLLER not in set(rows["label"]) or not present:
            continue
        inversion = fixed_k_inversion(rows[rows["label"].isin(present)])
        records.append({**cell, **{f"controller / {k.split(' ')[-1]}": paired_ratio(rows, CONTROLLER, k).text()
                                   for k in present},
                        "inversion among fixed k": {True: "yes", False: "no", None: "–"}[inversion]})
    table = pd.DataFrame(records)
    pooled = {k: pooled_ratio(s, CONTROLLER, k) for k in FIXED_K}
    pooled = {k: e for k, e in pooled.items() if e.ratio is not None}
    pooled_table = pd.DataFrame([pooled_row(f"controller / {k.split(' ')[-1]}", e) for k, e in pooled.items()])
    if not pooled:
        return Claim(claim, NOT_MEASURABLE, "no cell ran the controller beside fixed k", table, pooled_table)
    inverted = (table["inversion among fixed k"] == "yes").sum()
    return Claim(claim, combined_verdict([e.verdict() for e in pooled.values()]),
                 "pooled over cells, " + "; ".join(named(f"controller / {k.split(' ')[-1]}", e)
                                                   for k, e in pooled.items())
                 + f"; a longer fixed k accepted more yet ran slower (the inversion) in {inverted} of "
                   f"{len(table)} cells", table, pooled_table)


SAME_DRAFT_RATIO = "recycled top-K / other (same k and budget)"


def sweep_selection(sweep: pd.DataFrame | None) -> tuple[list[dict], dict[str, Estimate]]:
    """From a draft-budget sweep (`analysis.frames.selection_samples`), at k = SELECTION_K and each budget of
    SELECTION_BUDGETS: per cell, recycled top-K's tokens/s over each simpler draft's at that budget (paired
    per prompt), and each pooled over the cells (cells as blocks). Nothing without a sweep."""
    if sweep is None:
        return [], {}
    records, pooled = [], {}
    for budget in SELECTION_BUDGETS:
        at = sweep[(sweep["k"] == SELECTION_K) & (sweep["budget_frac"] == round(budget, 4))]
        mine = f"{RECYCLED} b={percent(budget)}"
        for other in SIMPLER_DRAFTS:
            theirs = f"{other} b={percent(budget)}"
            records += [{**cell, "k": SELECTION_K, "budget": percent(budget), "vs": other,
                         SAME_DRAFT_RATIO: est.text(), "standing": standing(est)}
                        for cell, rows in cells(at) if {mine, theirs} <= set(rows["label"])
                        for est in [paired_ratio(rows, mine, theirs)]]
            est = pooled_ratio(at, mine, theirs)
            if est.ratio is not None:
                pooled[f"recycled top-K (k={SELECTION_K}, budget {percent(budget)}) / {other}"] = est
    return records, pooled


def claim_selection(s: pd.DataFrame, sweep: pd.DataFrame | None = None) -> Claim:
    """Recycled top-K against streaming and SnapKV at the same k and budget: the matrix's k = 4 at the
    default budget and, given a budget sweep (`--selection`), k = SELECTION_K at each of SELECTION_BUDGETS,
    where a selection's misses compound. Reproduced only when every pooled comparison is."""
    claim = "Recycled top-K beats a streaming draft and a static SnapKV draft at the same budget"
    records = [{**cell, "k": SAME_K, "budget": "default", "vs": other, SAME_DRAFT_RATIO: est.text(),
                "standing": standing(est)}
               for cell, rows in cells(s) for other in SIMPLER_DRAFTS if {SAME_K_RECYCLED, other} <= set(rows["label"])
               for est in [paired_ratio(rows, SAME_K_RECYCLED, other)]]
    pooled = {f"recycled top-K (k={SAME_K}, default budget) / {o}": pooled_ratio(s, SAME_K_RECYCLED, o)
              for o in SIMPLER_DRAFTS}
    pooled = {what: e for what, e in pooled.items() if e.ratio is not None}
    swept_records, swept = sweep_selection(sweep)
    records += swept_records
    pooled.update(swept)
    pooled_table = pd.DataFrame([pooled_row(what, e) for what, e in pooled.items()])
    if not pooled:
        return Claim(claim, NOT_MEASURABLE, "no cell ran recycled top-K beside streaming or SnapKV",
                     pd.DataFrame(records), pooled_table)
    return Claim(claim, combined_verdict([e.verdict() for e in pooled.values()]),
                 "pooled over cells, " + "; ".join(named(what, e) for what, e in pooled.items()),
                 pd.DataFrame(records), pooled_table)


def claim_quality(s: pd.DataFrame) -> Claim:
    speculative = s[(s["label"] != "ar") & ~s["label"].str.startswith("hf_")]
    matched = speculative["outputs_match_ar"].dropna()
    claim = "Output quality is unchanged"
    if matched.empty:
        return Claim(claim, NOT_MEASURABLE, "no greedy sample was compared with AR")
    same = int(matched.astype(bool).sum())
    table = (speculative.groupby("label")["outputs_match_ar"].agg(["mean", "size"])
             .rename(columns={"mean": "share token-identical to AR", "size": "samples"}).reset_index())
    summary = f"{same} of {len(matched)} greedy outputs of the speculative methods are token-identical to AR's"
    if same == len(matched):
        summary += " (so every task score is identical; lm-eval parity is tested in tests/test_lm_eval.py)"
    retrieval = s[s["task"] == RETRIEVAL]
    if not retrieval.empty:           # the task scored by exact match: each method's accuracy beside AR's
        table["retrieval exact match"] = [exact_match(retrieval, label) for label in table["label"]]
        summary += f"; retrieval exact match, SparseSpec-L {exact_match(retrieval, CONTROLLER)}"
    return Claim(claim, estimates.REPRODUCED if same == len(matched) else estimates.CONTRADICTED, summary, table)


CLAIMS = (claim_context_growth, claim_across_tasks, claim_beats_other_drafters, claim_controller,
          claim_selection, claim_quality)


def check_claims(s: pd.DataFrame, sweep: pd.DataFrame | None = None) -> list[Claim]:
    """Every claim's verdict from the per-prompt frame (`samples(df)`); `sweep`, a draft-budget sweep's
    (`analysis.frames.selection_samples`), adds the selection claim's comparisons at k = SELECTION_K."""
    return [check(s, sweep) if check is claim_selection else check(s) for check in CLAIMS]


# ------------------------------------------------------------------------------------ tables

def speedup_table(s: pd.DataFrame, labels=(CONTROLLER, *FIXED_K, *SIMPLER_DRAFTS, "layerskip", "pld", "oracle",
                                             "hf_generate")) -> pd.DataFrame:
    """Speed-up over AR with its 95% interval, one row per cell, one column per method."""
    records = []
    for cell, rows in cells(s):
        record = {**cell, "ctx": ctx_label(cell["ctx"]), "prompts": rows.loc[rows["label"] == "ar", "prompt_id"].nunique()}
        record.update({label: speedup_ci(rows, label).text() for label in labels if label in set(rows["label"])})
        records.append(record)
    return pd.DataFrame(records)


README_LABELS = (CONTROLLER, "sparsespec_fixed k=4", "sparsespec_fixed k=8", "streaming", "snapkv_static")   # its table
PUBLISH = "--publish"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m analysis.claims", description=__doc__.split("\n")[0])
    parser.add_argument("results", help="the matrix's results folder (e.g. docs/runs/matrix)")
    parser.add_argument(PUBLISH, action="store_true",
                        help="also rewrite the published claims: --claims and the README's claims block")
    parser.add_argument("--claims", type=Path, help="with --publish: where the details go (default docs/claims.md)")
    parser.add_argument("--readme", help="with --publish: whose claims block to fill (default README.md; none: no README)")
    parser.add_argument("--selection", help="a draft-budget sweep's results folder (e.g. docs/runs/selection_budget): "
                        f"adds recycled top-K against the simpler drafts at k={SELECTION_K} to the selection claim")
    parser.add_argument("--no-figures", action="store_true", help="skip the figures and cost tables")
    add_mixed_commits_flag(parser)
    args = parser.parse_args(argv)
    if not args.publish and (args.claims or args.readme):
        parser.error(f"--claims and --readme name published files; they apply only with {PUBLISH}")
    args.claims = args.claims or Path("docs/claims.md")
    args.readme = None if args.readme == "none" else Path(args.readme or "README.md")
    return args


def command_line(args: argparse.Namespace) -> str:
    """The command that regenerates the published claims from these inputs."""
    return " ".join(["python -m analysis.claims", args.results, *(["--selection", args.selection] if args.selection else []),
                     PUBLISH])


def main(argv: list[str] | None = None) -> int:
    """Check every input, compute every claim, then write: <results>/claims.md (or, with --publish,
    --claims and the README's block) and <results>/figures."""
    args = parse_args(argv)
    readme = publish.text_with_block(args.readme) if args.publish and args.readme else None
    df = results_or_exit(args.results)
    sweep_df = results_or_exit(args.selection) if args.selection else None
    try:
        walls = publish.chunk_wall_seconds(Path(args.results))
        check_poolable(df, args.allow_mixed_commits)
        s = samples(df)
        sweep = None
        if sweep_df is not None:      # checked as analysis.selection checks it: cells by k too
            sweep = selection_samples(sweep_df)
            check_poolable(sweep, args.allow_mixed_commits, SELECTION_CELL)
    except (PoolingError, publish.WallTimesError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    claims = check_claims(s, sweep)
    command = command_line(args)
    hardware = ", ".join(distinct(df, "hardware")) or "unknown"
    prefill = publish.prefill_savings(df, walls)
    document = publish.claims_document(claims, s, speedup_table(s), command, hardware, prefill, cell_provenance(df))
    readme_text = None if readme is None else publish.replace_block(
        readme, publish.readme_block(claims, s, speedup_table(s, README_LABELS), args.results, command, prefill))
    # everything is checked and computed: only writing is left
    if not args.no_figures:
        from analysis.figures import generate
        generate(df, Path(args.results) / "figures")
    target = args.claims if args.publish else Path(args.results) / "claims.md"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(document)
    if readme_text is not None:
        args.readme.write_text(readme_text)
    for c in claims:
        print(f"{c.verdict:>20}  {c.claim}")
    print(f"wrote {target}" + (f" and the claims block of {args.readme}" if readme_text is not None else "")
          + ("" if args.publish else f" (nothing published: {PUBLISH} also rewrites docs/claims.md and the README)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
