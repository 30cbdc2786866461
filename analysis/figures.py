"""Regenerate every figure (PNG + PDF) and table (CSV, Markdown, LaTeX) from results, in one command.

    python -m analysis.figures multirun/ --out figures/
    python -m analysis.figures --wandb entity/project --group speedup_vs_context_cpu --out figures/

A figure whose data is absent is skipped with a printed note. Results that would be pooled wrongly
(a prompt decoded twice by one method in one cell; a cell run from several versions of the code, unless
`--allow-mixed-commits`) are refused before anything is written, as `analysis.claims` refuses them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; must precede any pyplot import downstream

import pandas as pd  # noqa: E402
from tqdm import tqdm  # noqa: E402

from analysis.load import load_results, load_wandb  # noqa: E402
from analysis.plots import FIGURES, SkipFigure  # noqa: E402
from analysis.provenance import PoolingError, add_mixed_commits_flag, check_poolable  # noqa: E402
from analysis.tables import TABLES, write_table  # noqa: E402


# No creation date in a PDF: the same results give the same bytes, so a regenerated figure shows in a diff
# only when it changed.
STABLE_METADATA = {"png": {}, "pdf": {"CreationDate": None}}


def save_figure(fig, out_dir: Path, stem: str) -> list[Path]:
    paths = [out_dir / f"{stem}.{suffix}" for suffix in STABLE_METADATA]
    for path in paths:
        fig.savefig(path, dpi=150, metadata=STABLE_METADATA[path.suffix[1:]])
    return paths


def generate(df: pd.DataFrame, out_dir: Path, only: list[str] | None = None,
             progress: bool = True) -> dict[str, list[Path]]:
    """Draw every figure and write every table; returns {name: files written} (empty when skipped)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = {**{n: ("figure", f) for n, f in FIGURES.items()}, **{n: ("table", f) for n, f in TABLES.items()}}
    if only:
        unknown = sorted(set(only) - set(jobs))
        if unknown:
            raise SystemExit(f"unknown figure/table {unknown}; choose from {sorted(jobs)}")
        jobs = {n: jobs[n] for n in only}
    written: dict[str, list[Path]] = {}
    bar = tqdm(jobs.items(), desc="figures", unit="item", disable=not progress)
    for name, (kind, make) in bar:
        bar.set_postfix_str(name)
        written[name] = _run_job(df, out_dir, name, kind, make)
    return written


def _run_job(df, out_dir: Path, name: str, kind: str, make) -> list[Path]:
    if kind == "table":
        return write_table(make(df), out_dir, name)
    try:
        figures = make(df)
    except SkipFigure as reason:
        tqdm.write(f"note: skipped {name}: {reason}")
        return []
    paths: list[Path] = []
    for stem, fig in figures:
        paths += save_figure(fig, out_dir, stem)
    return paths


def load(args: argparse.Namespace) -> pd.DataFrame:
    frames = []
    if args.results:
        frames.append(load_results(*args.results))
    if args.wandb:
        frames.append(load_wandb(args.wandb, group=args.group))
    if not frames:
        raise SystemExit("give results folders, or --wandb ENTITY/PROJECT")
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m analysis.figures", description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="*", help="run folders or trees of them (e.g. multirun/)")
    parser.add_argument("--out", type=Path, default=Path("figures"), help="output folder (default: figures/)")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="also load runs from W&B")
    parser.add_argument("--group", help="W&B run group to load (with --wandb)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help=f"a subset of {sorted({**FIGURES, **TABLES})}")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_mixed_commits_flag(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        df = load(args)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if df.empty:
        print("error: no samples.jsonl found under " + ", ".join(args.results or [args.wandb]), file=sys.stderr)
        return 2
    try:
        check_poolable(df, args.allow_mixed_commits)
    except PoolingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"loaded {len(df)} samples from {df['run'].nunique()} runs")
    written = generate(df, args.out, args.only, progress=not args.no_progress)
    made = sum(len(p) for p in written.values())
    print(f"wrote {made} files to {args.out}/ ({sum(1 for p in written.values() if p)} of {len(written)} items)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
