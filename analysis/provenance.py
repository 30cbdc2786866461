"""What may be pooled: the checks every analysis command runs on its results before it computes a
number, so that `analysis.figures`, `analysis.claims` and `analysis.selection` accept and refuse the
same folders (a draft-budget sweep's cells are told apart by k too: analysis.frames.SELECTION_CELL).

- A prompt decoded twice by one method in one cell (a cell run twice: two machines, two batch sizes,
  a rerun beside the first run) is refused: means and paired ratios would silently pool both runs.
- A decode speed or speed-up that is not positive is refused: every ratio is taken on the log scale.
- Runs of one cell made from different code are refused unless asked for (`allow_mixed_commits`):
  a cell's methods are compared with one another, so they must run the same code. Runs at different
  commits with one code fingerprint (summary.json `env.git.code`: a docs or results commit landed between
  them) run the same code; a run that predates the fingerprint is judged by its commit.
"""
from __future__ import annotations

import argparse

import pandas as pd

from analysis.frames import distinct, with_labels

CELL = ["model", "task", "ctx"]


class PoolingError(ValueError):
    """Results that an analysis would pool wrongly; the message is one line naming the runs."""


def cell_name(row, cell: list[str] = CELL) -> str:
    """`model/task/ctx`, and `/k=16` for a draft-budget sweep's cell (analysis.frames.SELECTION_CELL)."""
    return "/".join([f"{row['model']}/{row['task']}/{int(row['ctx'])}",
                     *(f"{c}={row[c]}" for c in cell if c not in CELL)])


def duplicate_prompts(df: pd.DataFrame, cell: list[str] = CELL) -> str | None:
    """One line naming a prompt decoded by one method (its label: k and budget included) in more than
    one run of one cell, or None."""
    labelled = df if "label" in df else with_labels(df)
    key = [*cell, "label", "prompt_id"]
    twice = labelled[labelled.duplicated(key, keep=False)]
    if twice.empty:
        return None
    first = twice.iloc[0]
    runs = twice[(twice[key] == first[key]).all(axis=1)]["run"]
    return (f"prompt {first['prompt_id']} of {first['label']} at {cell_name(first, cell)} appears in "
            f"{runs.nunique()} runs "
            f"({', '.join(map(str, sorted(runs.unique())))}); give one run per cell and method (a separate results "
            f"folder per machine or batch size)")


UNRECORDED = "commit:unrecorded"


def code_versions(df: pd.DataFrame) -> pd.Series:
    """Per row, what identifies the code its run ran: "code:<fingerprint>" when recorded, else the
    fingerprint another run recorded at the same commit (one commit holds one code), else
    "commit:<commit>" (a run from before the fingerprint), else UNRECORDED."""
    code = df["code"] if "code" in df else pd.Series(None, index=df.index, dtype=object)
    known = code.notna() & df["commit"].notna()
    code_at = dict(zip(df.loc[known, "commit"], code[known]))
    def version(commit, fingerprint) -> str:
        if pd.notna(fingerprint):
            return f"code:{fingerprint}"
        if pd.isna(commit):
            return UNRECORDED
        return f"code:{code_at[commit]}" if commit in code_at else f"commit:{commit}"
    return pd.Series([version(c, f) for c, f in zip(df["commit"], code)], index=df.index, dtype=object)


def short_commits(commits: pd.Series) -> list[str]:
    """The distinct commits of a column, 8 characters each, sorted; missing ones left out."""
    return sorted({str(c)[:8] for c in commits.dropna()})


def _version_text(version: str, commits: pd.Series) -> str:
    """`code 1a2b3c4d at aaaaaaaa, bbbbbbbb` or `commit aaaaaaaa (no code fingerprint)`."""
    kind, value = version.split(":", 1)
    if kind == "code":
        return f"code {value[:8]} at {', '.join(short_commits(commits)) or 'unrecorded'}"
    return "an unrecorded commit" if version == UNRECORDED else f"commit {value[:8]} (no code fingerprint)"


def mixed_commits(df: pd.DataFrame, cell: list[str] = CELL) -> str | None:
    """One line naming a cell whose runs ran different code (code_versions: by fingerprint, by commit
    where none was recorded) with the fingerprints and commits found, or None."""
    versions = code_versions(df)
    per_cell = versions.groupby([df[c] for c in cell]).nunique()
    mixed = per_cell[per_cell > 1]
    if mixed.empty:
        return None
    key, count = mixed.index[0], mixed.iloc[0]
    in_cell = (df[cell] == list(key)).all(axis=1)
    found = versions[in_cell]
    if found.str.startswith("commit:").all():          # no fingerprint recorded: as many commits as versions
        where = f"at {count} commits ({', '.join(sorted(v.split(':', 1)[1][:8] for v in found.unique()))})"
    else:
        where = (f"from {count} versions of the code (" + "; ".join(
            _version_text(v, df.loc[in_cell & (versions == v), "commit"]) for v in sorted(found.unique())) + ")")
    return (f"the runs of {cell_name(dict(zip(cell, key)), cell)} were made {where}; rerun the cell at one "
            f"commit, or pass "
            f"--allow-mixed-commits to pool them ({len(mixed)} cell(s) are mixed)")


UNMEASURED_AR = "unmeasured (SDPA with enable_gqa)"


def _cell_ar_paths(df: pd.DataFrame, cell: list[str]) -> pd.Series:
    """Per cell, the set of attention paths its AR denominator used (UNMEASURED_AR for old runs)."""
    path = df["ar_path"] if "ar_path" in df else pd.Series(None, index=df.index, dtype=object)
    path = path.where(path.notna(), UNMEASURED_AR)
    return path.groupby([df[c] for c in cell]).agg(lambda p: frozenset(p))


def ar_paths(df: pd.DataFrame, cell: list[str] = CELL) -> pd.Series:
    """Per cell, the attention path(s) its AR denominator used: the fastest its runs measured (`ar_path`;
    two where a cell was decoded in sittings on two machines), or UNMEASURED_AR for runs made before AR's
    paths were measured."""
    return _cell_ar_paths(df, cell).map(lambda paths: ", ".join(sorted(paths)))


def mixed_denominators(df: pd.DataFrame, cell: list[str] = CELL) -> str | None:
    """One line naming a cell whose AR was not measured beside cells (or runs of its own) whose AR was, or
    None: a speed-up over the old AR is inflated against one over the fastest, so they are not pooled."""
    paths = _cell_ar_paths(df, cell)
    old = paths[paths.map(lambda p: UNMEASURED_AR in p)]
    measured = paths[paths.map(lambda p: bool(p - {UNMEASURED_AR}))]
    if old.empty or measured.empty:
        return None
    key = old.index[0] if isinstance(old.index[0], tuple) else (old.index[0],)
    return (f"the AR of {cell_name(dict(zip(cell, key)), cell)} attended by an unmeasured path (summary.json has no "
            f"run.ar_variants: decoded before the fair denominator), beside runs in {len(measured)} cell(s) whose AR "
            f"used the fastest measured path ({len(old)} cell(s) hold old runs); move the old cells to "
            f"docs/runs/superseded, or pass --allow-mixed-commits to pool them")


def add_mixed_commits_flag(parser: argparse.ArgumentParser) -> None:
    """`--allow-mixed-commits`, for every command that runs check_poolable."""
    parser.add_argument("--allow-mixed-commits", action="store_true",
                        help="pool a cell's runs of different code (by fingerprint, else commit), or cells whose AR "
                             "denominators differ (measured path or not; both refused by default)")


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


def check_poolable(df: pd.DataFrame, allow_mixed_commits: bool = False, cell: list[str] = CELL) -> None:
    """Raise PoolingError when `df` holds a prompt twice in a cell, a speed that is not positive, or
    (unless allowed) a cell made from several versions of the code (see mixed_commits) or cells of both
    AR denominators (see mixed_denominators). `cell`: the
    columns that make a cell (a draft-budget sweep's add k: analysis.frames.SELECTION_CELL)."""
    for problem in (duplicate_prompts(df, cell), nonpositive_speeds(df),
                    None if allow_mixed_commits else mixed_commits(df, cell),
                    None if allow_mixed_commits else mixed_denominators(df, cell)):
        if problem:
            raise PoolingError(problem)


def cell_provenance(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: its commit(s) (8 characters; `(same code)` when several commits hold one code),
    whether any run came from modified code (code_dirty, or the whole tree's dirty flag for a run that
    predates it), whether any run found the machine busy ("?" where not recorded) and the attention path
    of its AR denominator (ar_paths), and the machine(s) its runs timed (`hardware`)."""
    def flag(values: pd.Series) -> str:
        known = values.dropna()
        return "?" if known.empty else ("yes" if known.astype(bool).any() else "no")
    versions = code_versions(df)
    paths = ar_paths(df)
    modified = df["code_dirty"].where(df["code_dirty"].notna(), df["dirty"]) if "code_dirty" in df else df["dirty"]
    records = []
    for key, rows in df.groupby(CELL, sort=True):
        commits = short_commits(rows["commit"]) or ["?"]
        codes = set(versions[rows.index])
        same = len(commits) > 1 and len(codes) == 1 and codes.pop().startswith("code:")
        records.append({**dict(zip(CELL, key)), "commit": ", ".join(commits) + (" (same code)" if same else ""),
                        "modified code": flag(modified[rows.index]), "noisy": flag(rows["noisy"]),
                        "AR path": paths[key], "hardware": ", ".join(distinct(rows, "hardware"))})
    return pd.DataFrame(records, columns=[*CELL, "commit", "modified code", "noisy", "AR path", "hardware"])
