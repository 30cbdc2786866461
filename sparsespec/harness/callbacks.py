"""Hydra callbacks: the output folder checked before anything runs; at the end of a sweep, one table
of every job's result and its errors."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from sparsespec.errors import ConfigError, exit_with_error
from sparsespec.harness.checks import make_output_folder
from sparsespec.harness.folder_lock import claim_folder, release_folder

ERROR_FILE = "error.txt"      # written into a job's folder by run.py when the job stops: one line, then any traceback
SUMMARY_FILE = "summary.json"


def _job_number(folder: Path) -> int:
    head = folder.name.split("_", 1)[0]
    return int(head) if head.isdigit() else -1


def _fmt(value, spec: str) -> str:
    """`format(value, spec)`, or a dash as wide as the spec's width for a missing value."""
    width = int(spec.split(".")[0]) if spec[0].isdigit() else 0
    return "-".rjust(width) if value is None else format(value, spec)


def first_line(path: Path) -> str:
    """The summary line of an error file (a traceback may follow it)."""
    lines = path.read_text().strip().splitlines()
    return lines[0] if lines else "(empty error file)"


def sweep_lines(sweep_dir: Path) -> tuple[list[str], list[str]]:
    """(one line per finished job, one line per failed job), in job order."""
    rows, errors = [], []
    for folder in sorted((p for p in sweep_dir.iterdir() if p.is_dir()), key=_job_number):
        if (folder / ERROR_FILE).exists():
            errors.append(f"  {folder.name}: {first_line(folder / ERROR_FILE)}")
        elif (folder / SUMMARY_FILE).exists():
            summary = json.loads((folder / SUMMARY_FILE).read_text())
            run, m = summary["run"], summary["metrics"]
            match = m["outputs_match_ar"]
            rows.append(f"  {folder.name:<56} {run['method']:<18} {run['ctx']:>7} {_fmt(m['tokens_per_s'], '8.2f')} "
                        f"{_fmt(m['ar_tokens_per_s'], '8.2f')} {_fmt(m['speedup_vs_ar'], '7.2f')} "
                        f"{_fmt(m['mean_accepted'], '6.2f')} {_fmt(match, '6.0%')}")
    return rows, errors


class OutputFolderCheck(Callback):
    """Before Hydra makes the output folder: one that cannot be made (`hydra.run.dir=/proc/x`, an
    existing file) is the one-line error and exit 2 of run.py, not a traceback from inside Hydra.
    The folder (a sweep's: its folder) is then claimed, before Hydra writes `.hydra/` (or
    multirun.yaml) into it: a run refused because another holds the folder changes nothing there."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._make("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._make("hydra.sweep.dir", config.hydra.sweep.dir)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        release_folder(Path(str(config.hydra.run.dir)))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        release_folder(Path(str(config.hydra.sweep.dir)))

    @staticmethod
    def _make(key: str, path: str) -> None:
        try:
            claim_folder(make_output_folder(key, path))
        except ConfigError as err:
            exit_with_error(err)


class SweepReport(Callback):
    """After a multirun: print each job's headline numbers; list the jobs that stopped on an error
    and then exit 2.

    Jobs of a sweep do not stop each other (a context too long for one model must not cancel the
    other models' runs, nor must a crash): a failed job leaves `error.txt` in its folder instead,
    whose first line is listed here.
    """

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            return
        rows, errors = sweep_lines(sweep_dir)
        if rows:
            print(f"sweep {sweep_dir}:")
            print(f"  {'job':<56} {'method':<18} {'ctx':>7} {'tok/s':>8} {'ar tok/s':>8} {'speedup':>7} "
                  f"{'tok/rd':>6} {'match':>6}")
            print("\n".join(rows), flush=True)
        if errors:
            print(f"{len(errors)} job(s) stopped on an error:", file=sys.stderr)
            print("\n".join(errors), file=sys.stderr, flush=True)
            sys.exit(2)
