"""Publishing the claims (`analysis.claims` computes them): docs/claims.md, the README's claims block,
and the tables beside them (shared prefill, with each chunk's wall time from wall_times.tsv).

Also the helpers every report command writes with (`analysis.claims`, `analysis.selection`,
`analysis.batch`): a Markdown file's generated block between two markers (`<!-- ...:begin -->` and
`<!-- ...:end -->`) checked before anything is computed (`text_with_block`), then filled
(`replace_block`, `write_report`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis import estimates
from analysis.frames import DEPTH_STEP, retrieval_by_depth
from analysis.provenance import add_mixed_commits_flag
from analysis.tables import ctx_label
from sparsespec.tables import markdown_table

if TYPE_CHECKING:
    from analysis.claims import Claim

MARK_BEGIN, MARK_END = "<!-- claims:begin -->", "<!-- claims:end -->"


# ------------------------------------------------------------------------------------ shared prefill

WALL_TIMES = "wall_times.tsv"        # experiments/run_matrix.sh: chunk, seconds, finished (one line a sitting)


class WallTimesError(ValueError):
    """A wall_times.tsv line that is not chunk<TAB>seconds<TAB>finished."""


def chunk_wall_seconds(results: Path) -> dict[str, float]:
    """Wall seconds of each chunk, summed over its logged sittings ({} without the file). run_matrix.sh
    logs a sitting when its run.py exits, stopped or not; one whose shell was killed too logs nothing,
    so a chunk shows the sittings that were logged (and committed)."""
    path = Path(results) / WALL_TIMES
    if not path.is_file():
        return {}
    walls: dict[str, float] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split("\t")
        if not line.strip():
            continue
        try:
            walls[fields[0]] = walls.get(fields[0], 0.0) + float(fields[1])
        except (IndexError, ValueError):
            raise WallTimesError(f"{path} line {number}: expected chunk<TAB>seconds<TAB>finished, got {line!r}") from None
    return walls


def prefill_savings(df: pd.DataFrame, walls: dict[str, float] | None = None) -> pd.DataFrame:
    """What one shared prefill a prompt cost and saved, per model and context. AR's rows carry the
    shared prefill's time and how many methods decoded from it (AR included); without sharing, each of
    them but one would have prefilled the prompt again. `walls`: chunk wall seconds by folder name (the
    first folder under the results root), shown beside the chunk's saving."""
    ar = df[(df["method"] == "ar") & (df["prefill_sharers"] > 1)]
    records = []
    for (model, ctx), rows in ar.groupby(["model", "ctx"], sort=True):
        saved = (rows["prefill_s"] * (rows["prefill_sharers"] - 1)).sum()
        sharers = sorted(rows["prefill_sharers"].astype(int).unique())
        record = {"model": model, "ctx": ctx_label(int(ctx)), "prompts": len(rows),
                  "prefill s/prompt": f"{rows['prefill_s'].mean():.0f} [{rows['prefill_s'].min():.0f}, "
                                      f"{rows['prefill_s'].max():.0f}]",
                  "methods per prefill": "–".join(map(str, dict.fromkeys([sharers[0], sharers[-1]]))),
                  "prefills saved": int((rows["prefill_sharers"] - 1).sum()),
                  "prefill time saved": f"{saved / 60:.0f} min"}
        chunks = {Path(run).parts[1] for run in rows["run"] if len(Path(run).parts) > 2}
        if walls is not None:
            known = [walls[c] for c in chunks if c in walls]
            record["chunk wall time"] = f"{sum(known) / 60:.0f} min" if known and len(known) == len(chunks) else "–"
        records.append(record)
    return pd.DataFrame(records)


# ------------------------------------------------------------------------------------ writing

def claims_table(claims: list[Claim]) -> str:
    return markdown_table([{"claim": c.claim, "verdict": f"**{c.verdict}**", "measured": c.summary} for c in claims])


METHOD_NOTE = ("Every ratio is on the log scale: a geometric mean with its Student-t 95% interval over prompts in a "
               "cell, and pooled over cells by a mixed model (cells as blocks, prompts within cells; statsmodels "
               "MixedLM, 95% Wald interval). A claim is **reproduced** when its pooled interval lies on the claimed "
               "side of 1, **contradicted** only when it lies wholly on the other side, and **inconclusive** "
               "otherwise. Comparisons between methods are paired per prompt.")


def claims_document(claims: list[Claim], s: pd.DataFrame, speedups: pd.DataFrame, command: str, hardware: str,
                    prefill: pd.DataFrame | None = None, provenance: pd.DataFrame | None = None) -> str:
    """docs/claims.md: `s` the per-prompt frame (`analysis.claims.samples`), `speedups` every cell's speed-ups
    (`analysis.claims.speedup_table`); `command` is the one that regenerates it (`analysis.claims.command_line`)."""
    parts = ["# The paper's claims, measured on the CPU matrix", "",
             f"Generated by `{command}` from the committed run summaries; do not "
             f"edit by hand. Hardware: {hardware}. Greedy, 128 new tokens, prefill excluded from every speed.", "",
             METHOD_NOTE, "", claims_table(claims), ""]
    for c in claims:
        parts += [f"## {c.claim}: {c.verdict}", "", c.summary + ".", ""]
        if not c.pooled.empty:
            parts += ["Pooled estimates (the verdict rests on these):", "", markdown_table(c.pooled), ""]
        if not c.evidence.empty:
            parts += ["Per cell:", "", markdown_table(c.evidence), ""]
    parts += ["## Speed-up over AR, every cell", "", "Geometric mean over prompts, 95% interval.", "",
              markdown_table(speedups), ""]
    by_depth = depth_table(s)
    if not by_depth.empty:
        parts += ["## Retrieval: speed-up and exact match by depth", "", DEPTH_NOTE, "", markdown_table(by_depth), ""]
    if provenance is not None and not provenance.empty:
        parts += ["## Provenance of each cell", "", PROVENANCE_NOTE, "", markdown_table(provenance), ""]
    if prefill is not None and not prefill.empty:
        parts += ["## One shared prefill a prompt", "", PREFILL_NOTE, "", markdown_table(prefill), ""]
    return "\n".join(parts)


def depth_table(s: pd.DataFrame) -> pd.DataFrame:
    """The retrieval task by depth (`analysis.frames.retrieval_by_depth`) for reading: the speed-up with its
    interval in one cell, exact match in percent; empty without retrieval samples."""
    table = retrieval_by_depth(s)
    if table.empty:
        return table
    return pd.DataFrame({"model": table["model"], "ctx": [ctx_label(c) for c in table["ctx"]], "method": table["label"],
                         "depth": [f"{d:.0%}" for d in table["depth"]], "prompts": table["n"],
                         "speed-up vs AR": [estimates.from_columns(m, lo, hi, n).text() if label != "ar" else "–"
                                            for m, lo, hi, n, label in zip(table["speedup"], table["low"],
                                                                           table["high"], table["n"], table["label"])],
                         "exact match": [f"{x:.0%}" if pd.notna(x) else "–" for x in table["exact_match"]]})


DEPTH_NOTE = ("The retrieval task's prompts by the depth of their evidence (the share of the context before it, in "
              f"bins of {DEPTH_STEP:.0%}): the speed-up over AR (geometric mean, 95% interval on the log scale) and the exact-match "
              "accuracy (the share of the asked items the output contains), AR's included.")
PROVENANCE_NOTE = ("The commit each cell's runs were made at (a cell's runs must share one code fingerprint, the hash of "
                   "the tracked code paths, or one commit for runs recorded without it, unless `--allow-mixed-commits`; "
                   "`(same code)` marks commits that differ only outside the code), whether any ran from modified code "
                   "(`modified code`; the whole tree for runs without a fingerprint), and whether the benchmark found "
                   "the machine busy before or after it (`noisy`), and the attention path of its AR denominator "
                   "(`AR path`: the fastest of the paths the run measured, or `unmeasured` for runs made before AR's "
                   "paths were measured, whose AR was slower than it needed to be at long contexts), and the machine its runs "
                   "timed (`hardware`: the CPU with the vector width torch used, or the GPU; each sample names the "
                   "machine that decoded it where it records one, else its run's last sitting's, so a sample written "
                   "before samples recorded their machine may come from an earlier sitting's).")
PREFILL_NOTE = ("AR and every engine method decode each prompt from one prefill (transformers' generate() rows "
                "prefill their own); a prefill saved is one each method but the first would otherwise have run. "
                "Chunk wall time is the whole chunk (`wall_times.tsv`), prefill and decoding of every method.")


def readme_block(claims: list[Claim], s: pd.DataFrame, speedups: pd.DataFrame, results: str, command: str,
                 prefill: pd.DataFrame | None = None) -> str:
    """The README's claims block: `speedups` the controller's and its closest rivals' speed-ups per cell."""
    measured = "; ".join(f"{model} at {', '.join(ctx_label(c) for c in sorted(rows['ctx'].unique()))}"
                         for model, rows in s.groupby("model", sort=True))
    return "\n".join([MARK_BEGIN,
                      f"<!-- generated by `{command}`; edits here are overwritten -->",
                      f"Cells measured so far: {measured}.", "",
                      claims_table(claims), "",
                      "Speed-up over AR (decode tokens/s, same process, same prompts; geometric mean and 95% interval "
                      "over prompts):", "",
                      markdown_table(speedups), "",
                      *(["Shared prefill, per model and context: " + PREFILL_NOTE, "", markdown_table(prefill), ""]
                        if prefill is not None and not prefill.empty else []),
                      f"Every cell and method, the pooled estimates and each cell's provenance: "
                      f"[docs/claims.md](docs/claims.md); figures and cost tables: `{results}/figures/`.", MARK_END])


def text_with_block(path: Path, begin: str = MARK_BEGIN, end: str = MARK_END, option: str = "--readme") -> str:
    """The text of a Markdown file whose generated block a command will fill, checked before the command
    writes anything: a missing file or missing markers is a one-line error (exit status 2)."""
    if not path.is_file():
        print(f"error: {option} {path} does not exist; give a Markdown file holding the {begin} ... {end} markers",
              file=sys.stderr)
        raise SystemExit(2)
    text = path.read_text()
    if begin not in text or end not in text:
        print(f"error: {option} {path} has no {begin} ... {end} block to fill; add the two markers", file=sys.stderr)
        raise SystemExit(2)
    return text


def replace_block(text: str, block: str, begin: str = MARK_BEGIN, end: str = MARK_END, where: str = "the README") -> str:
    """`text` with its generated block (from `begin` to `end`, markers included) replaced by `block`."""
    if begin not in text or end not in text:
        raise SystemExit(f"error: {where} has no {begin} ... {end} block to fill; add the two markers")
    head, rest = text.split(begin, 1)
    return head + block + rest.split(end, 1)[1]


def report_arguments(argv: list[str] | None, prog: str, description: str, example: str, markdown_name: str,
                     begin: str, end: str, mixed_commits_flag: bool = False) -> tuple[argparse.Namespace, str | None]:
    """The command line of a report command (`results`, `--doc`, and `--allow-mixed-commits` where the
    command checks its cells' code) and the text of the doc whose block it fills (None for `--doc none`),
    checked before anything is computed or written."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("results", help=f"the sweep's results folder (e.g. {example})")
    parser.add_argument("--doc", default="docs/benchmark.md",
                        help=f"whose generated block to fill; none: only the folder's {markdown_name} and figure")
    if mixed_commits_flag:
        add_mixed_commits_flag(parser)
    args = parser.parse_args(argv)
    doc_text = None if args.doc == "none" else text_with_block(Path(args.doc), begin, end, option="--doc")
    return args, doc_text


def write_report(folder: Path, markdown_name: str, markdown: str, figure, figure_stem: str,
                 doc: str, doc_text: str | None, block: str, begin: str, end: str) -> str:
    """Write <folder>/<markdown_name>, <folder>/figures/<figure_stem>.{png,pdf} and, unless `doc_text` is
    None (`--doc none`), the generated block of `doc` (read and checked beforehand by `text_with_block`).
    Returns the line that says what was written."""
    (folder / markdown_name).write_text(markdown)
    from analysis.figures import save_figure
    (folder / "figures").mkdir(exist_ok=True)
    save_figure(figure, folder / "figures", figure_stem)
    wrote = f"wrote {folder / markdown_name}, {folder / 'figures' / f'{figure_stem}.png'}"
    if doc_text is not None:
        Path(doc).write_text(replace_block(doc_text, block, begin, end, where=doc))
        wrote += f" and the generated block of {doc}"
    return wrote
