"""Run one configuration (or a sweep with -m): `python run.py [key=value ...]`. See docs/harness.md.

Results land in Hydra's output folder: samples.jsonl, summary.json (schema: docs/CONTRACTS.md).
Re-running the same settings into the same folder (`hydra.run.dir=...`) resumes.
"""
from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from sparsespec.errors import ConfigError, UnavailableError, exit_with_error, one_line
from sparsespec.harness.callbacks import ERROR_FILE
from sparsespec.harness.contexts import exact_context_overrides
from sparsespec.harness.interrupted import exit_code, interrupted_line, stop_like_ctrl_c_on_sigterm
from sparsespec.harness.option_overrides import check_option_overrides

log = logging.getLogger("run")
ARGUMENTS = sys.argv[1:]   # as typed (before the ctx rewrite below): what an interrupted run's resume repeats


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict | None:
    hydra_cfg = HydraConfig.get()
    folder = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    sweep = Path(hydra_cfg.sweep.dir)
    (folder / ERROR_FILE).unlink(missing_ok=True)   # a re-run of a failed sweep job starts clean
    try:
        from sparsespec.harness.runner import run  # torch & co. load only once Hydra has parsed the command line

        return run(cfg, folder, group=f"{sweep.parent.name}_{sweep.name}" if multirun else None)
    except KeyboardInterrupt as stop:   # Ctrl-C, or SIGTERM (interrupted.Terminated)
        # every finished sample is already on disk; the same command into the same folder resumes
        print(interrupted_line(sys.argv[0], ARGUMENTS, sweep.resolve() if multirun else folder, multirun),
              file=sys.stderr, flush=True)
        sys.exit(exit_code(stop))
    except (ConfigError, UnavailableError) as err:
        if not multirun:
            exit_with_error(err)
        # In a sweep one bad job must not stop the others: leave the error in its folder; the
        # SweepReport callback lists them all at the end and exits 2.
        record_job_error(folder, one_line(err))
        return None
    except Exception as err:
        if not multirun:
            raise   # a bug: the full traceback; every finished sample is already on disk
        record_job_error(folder, f"unexpected {type(err).__name__}: {one_line(err)}", traceback.format_exc())
        return None


def record_job_error(folder: Path, summary: str, details: str = "") -> None:
    """error.txt of a sweep job: the one-line summary the sweep report lists, then any traceback."""
    (folder / ERROR_FILE).write_text(summary + "\n" + details)
    log.error("error: %s%s", summary, f" (traceback in {folder / ERROR_FILE})" if details else "")


if __name__ == "__main__":
    stop_like_ctrl_c_on_sigterm()   # `kill`, scancel and a job's time limit stop a run as Ctrl-C does
    sys.argv[1:] = exact_context_overrides(sys.argv[1:])
    try:
        check_option_overrides(sys.argv[1:])
    except ConfigError as err:
        exit_with_error(err)
    main()
