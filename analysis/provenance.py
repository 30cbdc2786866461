"""What may be pooled: the checks every analysis command runs on its results before it computes a
number, so that `analysis.figures` and `analysis.claims` accept and refuse the same folders.

- A prompt decoded twice by one method in one cell (a cell run twice: two machines, two batch sizes,
  a rerun beside the first run) is refused: means and paired ratios would silently pool both runs.
- A decode speed or speed-up that is not positive is refused: every ratio is taken on the log scale.
- Runs of one cell made at different commits are refused unless asked for (`allow_mixed_commits`):
  a cell's methods are compared with one another, so they must run the same code.
"""
from __future__ import annotations

import pandas as pd

from analysis.frames import with_labels

CELL = ["model", "task", "ctx"]


class PoolingError(ValueError):
    """Results that an analysis would pool wrongly; the message is one line naming the runs."""


def cell_name(row) -> str:
    return f"{row['model']}/{row['task']}/{int(row['ctx'])}"


def duplicate_prompts(df: pd.DataFrame) -> str | None:
    """One line naming a prompt decoded by one method (its label: k and budget included) in more than
    one run of one cell, or None."""
    labelled = df if "label" in df else with_labels(df)
    twice = labelled[labelled.duplicated([*CELL, "label", "prompt_id"], keep=False)]
    if twice.empty:
        return None
    first = twice.iloc[0]
    runs = twice[(twice[CELL + ["label", "prompt_id"]] == first[CELL + ["label", "prompt_id"]]).all(axis=1)]["run"]
    return (f"prompt {first['prompt_id']} of {first['label']} at {cell_name(first)} appears in {runs.nunique()} runs "
            f"({', '.join(map(str, sorted(runs.unique())))}); give one run per cell and method (a separate results "
            f"folder per machine or batch size)")


def mixed_commits(df: pd.DataFrame) -> str | None:
    """One line naming a cell whose runs were made at more than one commit, or None. A run with no
    recorded commit counts as a commit of its own."""
    commits = df["commit"].fillna("unrecorded").astype(str)
    per_cell = commits.groupby([df[c] for c in CELL]).unique()
    mixed = per_cell[per_cell.map(len) > 1]
    if mixed.empty:
        return None
    (model, task, ctx), found = mixed.index[0], mixed.iloc[0]
    return (f"the runs of {model}/{task}/{int(ctx)} were made at {len(found)} commits "
            f"({', '.join(sorted(c[:8] for c in found))}); rerun the cell at one commit, or pass "
            f"--allow-mixed-commits to pool them ({len(mixed)} cell(s) are mixed)")


def nonpositive_speeds(df: pd.DataFrame) -> str | None:
    """One line naming a sample whose decode tokens/s or speed-up is 0 or negative (no log, so no
    ratio on the log scale), or None. Missing values (AR's own speed-up) are not checked."""
    for column in ("tokens_per_s", "speedup_vs_ar"):
        bad = df[df[column].notna() & (df[column] <= 0)]
        if not bad.empty:
            row = bad.iloc[0]
            return (f"{column} is {row[column]:g} for prompt {row['prompt_id']} of run {row['run']}; ratios need "
                    f"positive speeds (a run that timed nothing cannot be compared)")
    return None


def check_poolable(df: pd.DataFrame, allow_mixed_commits: bool = False) -> None:
    """Raise PoolingError when `df` holds a prompt twice in a cell, a speed that is not positive, or
    (unless allowed) a cell made at several commits."""
    for problem in (duplicate_prompts(df), nonpositive_speeds(df),
                    None if allow_mixed_commits else mixed_commits(df)):
        if problem:
            raise PoolingError(problem)


def cell_provenance(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: its commit(s) (8 characters), whether any run came from a modified tree and
    whether any run found the machine busy ("?" where not recorded)."""
    def flag(values: pd.Series) -> str:
        known = values.dropna()
        return "?" if known.empty else ("yes" if known.astype(bool).any() else "no")
    records = []
    for key, rows in df.groupby(CELL, sort=True):
        commits = sorted({str(c)[:8] for c in rows["commit"].dropna()}) or ["?"]
        records.append({**dict(zip(CELL, key)), "commit": ", ".join(commits),
                        "dirty tree": flag(rows["dirty"]), "noisy": flag(rows["noisy"])})
    return pd.DataFrame(records, columns=[*CELL, "commit", "dirty tree", "noisy"])
