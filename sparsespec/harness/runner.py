"""One run: read the config once (run_config.py), load the model and prompts, decode every batch of
prompts with each method of the run back to back (AR too, as the reference; in each batch's own
seeded order, `run_order`), write samples.jsonl / summary.json per method, log to the tracker,
print a table.

A run has one method (`method=...`, written into the run's folder, AR decoded beside it as the
reference), or several (`bench.methods=[...]`, the side-by-side benchmark: AR and every listed
method, each written into its own sub-folder, as if each had been a run of its own). Either way each
prompt is prefilled once and every method decodes from that prefill (`sparsespec.prefill`), and
every folder resumes on its own: a re-run skips the prompts a method has finished.

The jobs live apart: plan.py (folders, resume, what decodes each batch), decoding.py (prefill once,
decode each method), recording.py (samples, summary.json, tracker, tables); `run` joins them.
"""
from __future__ import annotations

import logging
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
from omegaconf import DictConfig


from sparsespec.harness import decoding, environment
from sparsespec.harness.calibration import RunCalibration
from sparsespec.harness.decoding import decode_all, load_inputs, warm_up
from sparsespec.harness.folder_lock import hold_folder
from sparsespec.harness.plan import MethodRun, open_results, shared_with
from sparsespec.harness.recording import kept_summary, open_trackers, print_table, summary_of, write_summary
from sparsespec.harness.run_config import AR, RunConfig, build_run_config

log = logging.getLogger(__name__)


def run(cfg: DictConfig, folder: Path, *, group: str | None = None) -> dict:
    """Run `cfg` into `folder`, resuming what a previous run of the same settings finished there.
    Returns the summary (of each method, by entry, for a benchmark). The folder stays locked while
    the run lives: a second run into it stops at once (ConfigError)."""
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    folder = Path(folder)
    config = build_run_config(cfg, folder)
    for warning in config.warnings:   # once, before anything loads; summary.json keeps them
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    with hold_folder(folder):
        return run_in_held_folder(config, folder, started=started, group=group)


def run_in_held_folder(config: RunConfig, folder: Path, *, started: str, group: str | None) -> dict:
    """`run` once the folder is checked and held: resume, load, decode the pending prompts, summarize."""
    runs = [MethodRun(spec) for spec in config.methods]
    git, machine = environment.git_state(), environment.sitting_machine()
    for method_run in runs:
        open_results(method_run, config)
        method_run.git = git   # summary.json and every sample name the code as the sitting starts
        method_run.machine = machine
    torch.manual_seed(config.seed)
    busy_before = environment.cpu_busy_fraction()
    memo = decoding.PREFILL_MEMO
    memo.resize(int(config.prefill_memo_gb * 2**30), config.prefill_cache_dir, int(config.prefill_cache_gb * 2**30))
    hits_before, disk_hits_before = memo.hits, memo.disk_hits

    model, tokenizer, prompts = load_inputs(config)
    pending = [p for p in prompts if not all(r.done(p) for r in runs)]
    for method_run in runs:
        if method_run.resumed:
            log.info("resuming %s in %s: %d of %d prompts already done", method_run.entry, method_run.spec.folder,
                     sum(method_run.done(p) for p in prompts), len(prompts))
    summaries = {}
    try:
        open_trackers(runs, config, group)
        if pending and config.warmup:
            warm_up(model, pending[0], runs, config)
        cost_priors = RunCalibration()   # priors and threads by entry, measured on the first prefill each run decodes from
        decode_all(model, tokenizer, prompts, runs, config, cost_priors)
        busy_after = environment.cpu_busy_fraction()
        load = {"cpu_busy_before": busy_before, "cpu_busy_after": busy_after,
                "noisy": environment.is_noisy(busy_before) or environment.is_noisy(busy_after)}
        bench = {"methods": [r.entry for r in runs], **load} if config.bench else None
        sharing = shared_with(runs, config)
        for method_run in runs:
            samples = [method_run.finished[(str(p.id), method_run.label)] for p in prompts]
            kept = kept_summary(method_run)
            if kept is not None:
                log.info("%s: nothing left to decode; its summary.json is kept as written", method_run.entry)
                summaries[method_run.entry] = (kept, samples)
                continue
            summary = summary_of(config, method_run, samples, model=model, started=started, shared_with=sharing,
                                 bench=bench, cost_prior=cost_priors.get(method_run.entry),
                                 prefills_reused=memo.hits - hits_before,
                                 prefills_from_disk=memo.disk_hits - disk_hits_before,
                                 thread_choice=cost_priors.choices.get(AR if method_run.method == AR else method_run.entry),
                                 load=load, ar_variants=cost_priors.ar_variants())
            write_summary(method_run, summary, samples)
            summaries[method_run.entry] = (summary, samples)
    finally:
        for method_run in runs:
            if method_run.tracker is not None:
                method_run.tracker.finish()
    print_table(config, summaries, folder)
    if not config.bench:
        return summaries[runs[0].entry][0]
    return {entry: s for entry, (s, _) in summaries.items()}
