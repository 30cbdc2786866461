"""Experiment tracking: W&B (offline unless asked otherwise) or nothing (logger=none, or W&B disabled).

W&B is imported only when used. Local results never depend on it: if W&B cannot start or a call
fails, the run says so once and carries on without it (online without a login falls back to
offline first, so the data can still be uploaded later with `wandb sync`).
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from sparsespec.errors import describe

from sparsespec.harness.checks import wandb_mode

log = logging.getLogger(__name__)


SAMPLE_COLUMNS = ("prompt_id", "method", "context_tokens", "new_tokens", "prefill_s", "decode_s",
                  "tokens_per_s", "ar_tokens_per_s", "speedup_vs_ar", "mean_accepted", "acceptance_rate",
                  "outputs_match_ar", "score", "text", "reference")
ROUND_FIELDS = ("drafted", "accepted", "emitted", "draft_s", "verify_s", "select_s", "draft_steps")


class Tracker:
    """Does nothing; the interface every tracker offers."""

    folder: Path | None = None

    def log_prompt(self, index: int, sample: dict) -> None: ...

    def log_summary(self, summary: dict) -> None: ...

    def log_samples(self, samples: list[dict]) -> None: ...

    def save_files(self, paths: list[Path]) -> None: ...

    def finish(self) -> None: ...


class WandbTracker(Tracker):
    """Per-round metrics on their own `round/index` axis, per-prompt metrics on `prompt/index`,
    summary metrics and a table of samples."""

    def __init__(self, run):
        self.run = run
        self.folder = Path(run.dir).parent
        self.rounds_logged = 0
        run.define_metric("round/index")
        run.define_metric("round/*", step_metric="round/index")
        run.define_metric("prompt/index")
        run.define_metric("prompt/*", step_metric="prompt/index")

    def _safely(self, what: str, fn) -> None:
        """Run one W&B call; on failure say so once and stop using W&B (results stay local)."""
        if self.run is None:
            return
        try:
            fn()
        except Exception as err:  # W&B raises many types (network, service, usage); none may stop a run
            log.warning("W&B %s failed (%s); continuing with local results only", what, describe(err))
            self.run = None

    def log_prompt(self, index: int, sample: dict) -> None:
        def log_all():
            for r in sample["rounds"]:
                entropies = r.get("entropies") or []
                row = {f"round/{k}": r[k] for k in ROUND_FIELDS if k in r}
                if entropies:
                    row["round/mean_entropy"] = sum(entropies) / len(entropies)
                self.run.log({"round/index": self.rounds_logged, "round/prompt": index, **row})
                self.rounds_logged += 1
            scalars = {k: v for k, v in sample.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            scalars.update({f"time_{k}_s": v for k, v in sample["time_split"].items()})
            if sample.get("outputs_match_ar") is not None:
                scalars["outputs_match_ar"] = float(sample["outputs_match_ar"])
            self.run.log({"prompt/index": index, **{f"prompt/{k}": v for k, v in scalars.items()}})
        self._safely("logging a prompt", log_all)

    def log_summary(self, summary: dict) -> None:
        """Summary metrics into the run summary; the run and env sections into its config."""
        def log_all():
            self.run.summary.update({k: v for k, v in summary["metrics"].items() if v is not None})
            self.run.config.update({"run": summary["run"], "env": summary["env"]}, allow_val_change=True)
        self._safely("summary", log_all)

    def save_files(self, paths: list[Path]) -> None:
        """Copy result files (samples.jsonl, summary.json) into the run's files, uploaded with it."""
        def save_all():
            for path in paths:
                shutil.copyfile(path, Path(self.run.dir) / path.name)
        self._safely("saving result files", save_all)

    def log_samples(self, samples: list[dict]) -> None:
        def log_table():
            import wandb

            rows = [[s.get(c) for c in SAMPLE_COLUMNS] for s in samples]
            self.run.log({"samples": wandb.Table(columns=list(SAMPLE_COLUMNS), data=rows)})
        self._safely("table of samples", log_table)

    def finish(self) -> None:
        if self.run is not None:
            self._safely("finish", self.run.finish)
        self.run = None


def _start_wandb(options: dict, mode: str, *, config: dict, folder: Path, name: str, group: str | None,
                 several: bool = False):
    import wandb

    # several: a benchmark logs each method to its own W&B run, all open in this one process
    settings = wandb.Settings(console="off", silent=True, init_timeout=60,
                              **({"reinit": "create_new"} if several else {}))
    return wandb.init(project=options.get("project"), entity=options.get("entity"), mode=mode,
                      group=options.get("group") or group, tags=list(options.get("tags") or []),
                      name=name, dir=str(folder), config=config, settings=settings)


def _has_login() -> bool:
    import wandb

    return bool(wandb.login(prompt=False, verify=False))


def make_tracker(options: dict, *, config: dict, folder: Path, name: str, group: str | None,
                 several: bool = False) -> Tracker:
    """The tracker `logger` asks for. W&B online falls back to offline (no login, no network),
    and offline to no tracker at all; each fallback is said once."""
    mode = wandb_mode(options.get("mode"))
    if options.get("name") != "wandb" or mode == "disabled":   # disabled: no W&B at all, not one line of it
        return Tracker()
    start = dict(config=config, folder=folder, name=name, group=group, several=several)
    problem = None
    try:
        if mode == "online" and not _has_login():
            problem, mode = "no W&B login found", "offline"
        run = _start_wandb(options, mode, **start)
    except Exception as err:  # import, service start-up, network or login errors alike
        if mode == "offline":
            log.warning("W&B unavailable (%s); continuing with local results only", describe(err))
            return Tracker()
        problem, mode = f"W&B {mode} failed ({describe(err)})", "offline"
        try:
            run = _start_wandb(options, mode, **start)
        except Exception as err2:  # same as above, offline this time
            log.warning("%s, and offline too (%s); continuing with local results only", problem, describe(err2))
            return Tracker()
    where = Path(run.dir).parent
    if problem:
        log.warning("%s; logging offline instead into %s (`wandb login`, then `wandb sync %s`)", problem, where, where)
    elif mode == "offline":
        log.info("W&B run (offline): %s; upload it later with `wandb sync %s`", where, where)
    else:
        log.info("W&B run (%s): %s", mode, getattr(run, "url", None) or where)
    return WandbTracker(run)
