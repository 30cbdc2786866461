"""One run: check the config, load the model and prompts, decode every prompt with each method of
the run back to back (AR too, as the reference; in each prompt's own seeded order, `run_order`),
write samples.jsonl / summary.json per method, log to the tracker, print a table.

A run has one method (`method=...`, written into the run's folder, AR decoded beside it as the
reference), or several (`bench.methods=[...]`, the side-by-side benchmark: AR and every listed
method, each written into its own sub-folder, as if each had been a run of its own). Either way each
prompt is prefilled once and every method decodes from that prefill (`sparsespec.prefill`), and
every folder resumes on its own: a re-run skips the prompts a method has finished.
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import sparsespec
from sparsespec import calibration, hf_reference, stats, threads
from sparsespec.batch import batched_methods, check_batchable
from sparsespec.calibration import RunCalibration
from sparsespec.eos import before_eos, eos_token_ids
from sparsespec.errors import ConfigError
from sparsespec.models import load_model, max_context
from sparsespec.shared_prefill import PrefillMemo
from sparsespec.tasks import load_prompts

from . import environment
from .checks import (as_dict, check_config, check_context_fits, context_warnings, device_name,
                     method_options, model_spec)
from .entries import entry_folder, entry_key, method_node, resolved_method_options
from .folder_lock import hold_folder
from .order import prompt_order
from .report import format_bench_table, format_table
from .results import SUMMARY, SamplesFile, aggregate, batch_metrics, build_sample, check_resume, sample_key, write_json
from .tracking import make_tracker

log = logging.getLogger(__name__)

WARMUP_TOKENS = 16    # enough for a few draft/verify rounds; the warm-up output is thrown away
WARMUP_PREFIX = 2048  # warm up on the prompt's first tokens: every code path, without a long prefill
AR = "ar"


# --------------------------------------------------------------------------------------------
# the methods of a run


@dataclass
class MethodRun:
    """One method's share of a run: its config (the run's, with this method), folder and results."""
    entry: str                    # as listed: "sparsespec", "sparsespec_fixed:k=4", "hf_pld"
    cfg: DictConfig
    folder: Path
    samples: SamplesFile = field(init=False)
    finished: dict = field(default_factory=dict)   # (prompt_id, label) -> sample
    resumed: bool = False
    tracker: object = None

    def __post_init__(self):
        self.samples = SamplesFile(self.folder)

    @property
    def method(self) -> str:
        return self.cfg.method.name

    @property
    def label(self) -> str:
        return self.cfg.method.label

    @property
    def options(self) -> dict:
        return method_options(self.cfg)

    def done(self, prompt) -> bool:
        return (str(prompt.id), self.label) in self.finished


def is_bench(cfg: DictConfig) -> bool:
    return bool(cfg.get("bench") and cfg.bench.get("methods"))


def bench_entries(cfg: DictConfig) -> list[str]:
    """AR, then every listed method, each once."""
    return list(dict.fromkeys([AR, *(str(m) for m in cfg.bench.methods)]))


def config_for(cfg: DictConfig, entry: str) -> DictConfig:
    """The run's config with `method` set to the entry's."""
    method_cfg = cfg.copy()
    OmegaConf.set_struct(method_cfg, False)
    method_cfg.method = method_node(entry)
    return method_cfg


def method_runs(cfg: DictConfig, folder: Path) -> list[MethodRun]:
    if not is_bench(cfg):
        return [MethodRun(entry=cfg.method.label, cfg=cfg, folder=folder)]
    return distinct_runs([MethodRun(entry=e, cfg=config_for(cfg, e), folder=folder / entry_folder(e))
                          for e in bench_entries(cfg)])


def distinct_runs(runs: list[MethodRun]) -> list[MethodRun]:
    """`runs` with each method-and-options decoded once: an entry that resolves to an earlier one
    (`sparsespec:` after `sparsespec`) is dropped with one line saying so. Two different entries
    whose folders would be one are a ConfigError: each folder holds one method's samples."""
    kept: dict[str, MethodRun] = {}
    folders: dict[Path, MethodRun] = {}
    for run in runs:
        key = entry_key(run.cfg)
        if key in kept:
            print(f"warning: bench.methods entry {run.entry!r} is {kept[key].entry!r} again (same method and "
                  f"options); decoded once, into {kept[key].folder}", file=sys.stderr, flush=True)
            continue
        if run.folder in folders:
            raise ConfigError(f"bench.methods entries {folders[run.folder].entry!r} and {run.entry!r} differ but "
                              f"would share the folder {run.folder}; write one of them so its name differs "
                              f"by more than punctuation")
        kept[key], folders[run.folder] = run, run
    return list(kept.values())


def check_method_run(run: MethodRun) -> None:
    resolved_method_options(run.method, run.options)
    if batch_size(run.cfg) > 1:
        if hf_reference.is_reference(run.method):
            raise ConfigError(f"method {run.method!r} does not run batched (batch_size={batch_size(run.cfg)}); "
                              f"batched methods: {batched_methods()}")
        check_batchable(run.method, run.options)


def batch_size(cfg: DictConfig) -> int:
    return int(cfg.get("batch_size", 1) or 1)


# --------------------------------------------------------------------------------------------
# names and settings


def result_names(cfg: DictConfig) -> dict:
    """The names a sample and the summary carry (the method by its label: sparsespec_fixed etc.)."""
    return {"model": cfg.model.name, "task": cfg.task.name, "source": cfg.task.source, "method": cfg.method.label}


def resume_settings(cfg: DictConfig, device: str) -> dict:
    """Every setting a sample depends on. num_prompts, logging and warm-up are left out: a resume
    may ask for more prompts or log elsewhere, and still reuse the finished ones."""
    return {"model": model_spec(cfg), "task": as_dict(cfg.task), "ctx": cfg.ctx,
            "method": cfg.method.name, "label": cfg.method.label, "options": method_options(cfg),
            "seed": cfg.seed, "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature,
            "top_p": cfg.top_p, "stop_at_eos": cfg.stop_at_eos, "compare_ar": cfg.compare_ar,
            "dtype": cfg.dtype, "device": device,
            **({"batch_size": batch_size(cfg)} if batch_size(cfg) > 1 else {})}   # batch 1: as before


# --------------------------------------------------------------------------------------------
# loading


def task_options(cfg: DictConfig) -> dict:
    """The options only some tasks have (retrieval's variant and depth), as far as the task file sets them."""
    return {key: cfg.task.get(key) for key in ("variant", "depth") if cfg.task.get(key) is not None}


def load_inputs(cfg: DictConfig, device: str):
    """(model, tokenizer, prompts), with a progress bar over the two loads."""
    spec = model_spec(cfg)
    with tqdm(total=2, desc="loading", unit="step") as bar:
        bar.set_postfix_str(f"model {cfg.model.name} ({cfg.dtype}, {device})")
        model, tokenizer = load_model(spec, dtype=cfg.dtype, device=device)
        check_context_fits(cfg.ctx, cfg.max_new_tokens, cfg.model.name, max_context(model, spec))
        bar.update()
        bar.set_postfix_str(f"{cfg.num_prompts} {cfg.task.name} prompts from {cfg.task.source}")
        fill = {} if cfg.task.min_fill is None else {"min_fill": cfg.task.min_fill}
        prompts = load_prompts(cfg.task.name, source=cfg.task.source, tokenizer=tokenizer,
                               context_tokens=cfg.ctx, num_prompts=cfg.num_prompts, seed=cfg.seed,
                               path=cfg.task.path, subset=cfg.task.subset, **fill, **task_options(cfg))
        bar.update()
    if not prompts:
        raise ConfigError(f"task {cfg.task.name} (source={cfg.task.source}) produced no prompts at ctx={cfg.ctx}")
    return model, tokenizer, prompts


# --------------------------------------------------------------------------------------------
# decoding one prompt


# Prefills kept across the runs of this process (`prefill_memo_gb`): the jobs of a Hydra multirun on
# the basic launcher decode one after another here, so a batch-size sweep prefills each prompt once.
PREFILL_MEMO = PrefillMemo()


def profiles_to_measure(todo: list["MethodRun"], cfg: DictConfig, cost_priors: RunCalibration) -> dict:
    """label -> ProfileJob (sparsespec/calibration.py) still to measure: for each drafting run in `todo`
    not yet calibrated, a thread probe at every count (sparsespec/threads.py), and for one whose
    controller reads costs (the entropy controller) a cost profile sized to the run; AR steps at every count while
    AR's threads are unchosen. Each is measured on the prefill of the prompt (or batch) about to be
    decoded, before its methods decode, so it costs no prefill of its own."""
    if not cfg.cost_profile:
        return {}
    wanted = {run.entry: (run.method, run.options) for run in todo
              if run.entry not in cost_priors and not hf_reference.is_reference(run.method)
              and calibration.has_thread_probe(run.method)}
    ar = AR not in cost_priors.choices and any(m == AR for m, _ in decoders_for(todo, cfg).values())
    return calibration.plan_profiles(wanted, ar=ar, max_new_tokens=cfg.max_new_tokens, num_prompts=cfg.num_prompts)


def measure_profiles(model, inputs, starts, profiles: dict, cost_priors: RunCalibration) -> None:
    """Measure every job of `profiles` from its start in `starts` (one prompt's prefill: label ->
    Prefilled; a batch's: a list of them) into `cost_priors` (priors and thread choices by entry)."""
    if not profiles:
        return
    start = time.perf_counter()
    calibration.measure_planned(model, inputs, starts, profiles, cost_priors)
    log.info("%d calibration decodes (from the shared prefill; not recorded as samples): %.1f s; threads %s",
             len(profiles), time.perf_counter() - start, {e: c.threads for e, c in cost_priors.choices.items()})


def prefill(model, prompt, engine: dict, profiles: dict, max_new_tokens: int) -> dict:
    """One prefill of `prompt` for the engine's decoders and the cost profiles (each at its own length)."""
    methods = {**engine, **{label: (job.method, job.options) for label, job in profiles.items()}}
    return sparsespec.prefill(model, prompt, methods=methods, max_new_tokens=max_new_tokens,
                              lengths={label: job.length for label, job in profiles.items()}, memo=PREFILL_MEMO)


def decode_prompt(model, input_ids, decoders: dict[str, tuple[str, dict]], cfg: DictConfig, seed: int,
                  max_new_tokens: int, cost_priors: RunCalibration | None = None, profiles: dict | None = None) -> dict:
    """label -> Generation for every decoder (label -> (method, options)), back to back in the
    given order, all of sparsespec's methods from one shared prefill of the prompt. `profiles`
    (`profiles_to_measure`) are measured first, from the same prefill, into `cost_priors`."""
    cost_priors = RunCalibration() if cost_priors is None else cost_priors
    profiles = profiles or {}
    engine = {label: d for label, d in decoders.items() if not hf_reference.is_reference(d[0])}
    starts = prefill(model, input_ids, engine, profiles, max_new_tokens) if engine or profiles else {}
    measure_profiles(model, input_ids, starts, profiles, cost_priors)
    common = dict(temperature=cfg.temperature, top_p=cfg.top_p, seed=seed, stop_at_eos=cfg.stop_at_eos)
    gens = {}
    for label, (method, options) in decoders.items():
        with threads.using(cost_priors.threads_for(label, method)):
            if label in starts:
                gens[label] = sparsespec.generate(model, input_ids, prefilled=starts.pop(label),
                                                  cost_prior=cost_priors.get(label), **common)
            else:
                gens[label] = hf_reference.hf_generate(model, input_ids, method=method,
                                                       max_new_tokens=max_new_tokens, **common, **options)
    return gens


def decode_batch(model, inputs: list, decoders: dict[str, tuple[str, dict]], cfg: DictConfig, seed: int,
                 max_new_tokens: int, cost_priors: RunCalibration | None = None, profiles: dict | None = None) -> dict:
    """label -> BatchGenerations (one Generation per prompt of `inputs`) for every decoder, back to
    back, each decoding the whole batch together (sparsespec/batch.py), all from one shared prefill
    of each prompt (as `decode_prompt`: N methods cost one prefill a prompt, not N). `profiles` are
    measured first, on the batch, from the same prefills: a batch's controller weighs a batch's costs."""
    cost_priors = RunCalibration() if cost_priors is None else cost_priors
    profiles = profiles or {}
    prompts = [torch.as_tensor(ids).view(-1) for ids in inputs]
    starts = [prefill(model, p, decoders, profiles, max_new_tokens) for p in prompts]
    measure_profiles(model, prompts, starts, profiles, cost_priors)
    common = dict(temperature=cfg.temperature, top_p=cfg.top_p, seed=seed, stop_at_eos=cfg.stop_at_eos)
    gens = {}
    for label, (method, _) in decoders.items():
        with threads.using(cost_priors.threads_for(label, method)):
            gens[label] = sparsespec.generate(model, prompts, prefilled=[s.pop(label) for s in starts],
                                              cost_prior=cost_priors.get(label), **common)
    return gens


def batch_fields(gens, ref, row: int) -> dict:
    """What a sample of a batched run adds: the batch's throughput (tokens/s over the batch) and
    batched AR's at the same batch size, their ratio and the batch's cost-model bound (AR: none),
    and where the prompt sat in the batch."""
    ar = ref.tokens_per_s if ref is not None else None
    return {"batch_size": gens.batch_size, "batch_row": row, "batch_decode_s": gens.decode_s,
            "batch_tokens_per_s": gens.tokens_per_s, "ar_batch_tokens_per_s": ar,
            "batch_speedup_vs_ar": gens.tokens_per_s / ar if ar else None,
            "batch_bound": None if gens is ref else stats.batch_bound([g.rounds for g in gens], ar)}


REFERENCE = "ar (reference)"   # the AR decode a prompt needs as the reference but no folder records


def decoders_for(runs: list[MethodRun], cfg: DictConfig) -> dict[str, tuple[str, dict]]:
    """What to decode for one prompt, by entry: AR first (recorded, or only as the reference), then `runs`."""
    ar_runs = {run.entry: (AR, {}) for run in runs if run.method == AR}
    others = {run.entry: (run.method, run.options) for run in runs if run.method != AR}
    reference = {REFERENCE: (AR, {})} if cfg.compare_ar and others and not ar_runs else {}
    return {**reference, **ar_runs, **others}


def in_run_order(decoders: dict, runs: list[MethodRun], cfg: DictConfig, index: int) -> dict:
    """`decoders` (`decoders_for` some of `runs`) in the run order of prompt (or batch) `index`
    (order.py), drawn over all of `runs` so that a resume decodes what is left in the order the
    first sitting had; the unrecorded AR reference takes AR's place. `fixed`: as `decoders_for` lists them."""
    order = prompt_order(list(dict.fromkeys([AR, *(run.entry for run in runs)])), cfg.seed, index, cfg.run_order)
    place = {label: order.index(AR if label == REFERENCE else label) for label in decoders}
    return dict(sorted(decoders.items(), key=lambda item: place[item[0]]))


def reference_of(gens: dict, runs: list[MethodRun]):
    """The prompt's AR decode, the reference of every speed-up (None when there is none)."""
    ar_entries = [REFERENCE] + [run.entry for run in runs if run.method == AR]
    return next((gens[entry] for entry in ar_entries if entry in gens), None)


def text_of(tokens: list[int], tokenizer, model) -> str:
    """The decoded output, up to and without the first EOS (decoding may run past it, for timing)."""
    return tokenizer.decode(before_eos(tokens, eos_token_ids(model)), skip_special_tokens=True)


def sample_of(run: MethodRun, prompt, gen, ref, model, tokenizer) -> dict:
    """The samples.jsonl line of `run`'s method on `prompt` (`ref`: the AR decode, or None)."""
    cfg = run.cfg
    if run.method == AR:
        ref = gen                                        # AR is its own reference
    text = text_of(gen.tokens, tokenizer, model)
    value = prompt.score(text) if prompt.reference is not None else None
    return build_sample(prompt=prompt, gen=gen, ref=ref if cfg.compare_ar or ref is gen else None,
                        names=result_names(cfg), ctx=cfg.ctx, text=text, score=value, greedy=cfg.temperature == 0)


def warm_up(model, prompt, runs: list[MethodRun], cfg: DictConfig) -> None:
    """One short untimed generation of every method on the prompt's first WARMUP_PREFIX tokens, so
    one-off costs (kernels, draft-weight copies) do not land on prompt 1. A draft budget that does
    not fit that prefix warms up on the whole prompt instead."""
    start = time.perf_counter()
    max_new = min(WARMUP_TOKENS, cfg.max_new_tokens)
    decoders = decoders_for([r for r in runs if not r.done(prompt)], cfg)
    with PREFILL_MEMO.paused():  # a warm-up prefill is neither kept nor served: prompt 1's own stays timed
        if batch_size(cfg) > 1:     # the batched path, on copies of the prompt's prefix
            decode_batch(model, [torch.as_tensor(prompt.input_ids).view(-1)[:WARMUP_PREFIX]] * batch_size(cfg), decoders,
                         cfg, cfg.seed, max_new)
            return
        try:
            decode_prompt(model, prompt.input_ids[:WARMUP_PREFIX], decoders, cfg, cfg.seed, max_new)
        except ConfigError:
            decode_prompt(model, prompt.input_ids, decoders, cfg, cfg.seed, max_new)
    log.info("warm-up (%d methods x %d new tokens, not recorded): %.1f s", len(decoders), max_new,
             time.perf_counter() - start)


# --------------------------------------------------------------------------------------------
# the run


def run_prompts(model, tokenizer, prompts, runs: list[MethodRun], cfg: DictConfig, cost_priors: RunCalibration) -> None:
    """Decode `prompts` one at a time, every unfinished method from one shared prefill of each, in the
    prompt's run order (`in_run_order`); record one sample per prompt and method, with its place in that
    order (`run_position`). The bar shows the last method's speed and speed-up."""
    bar = tqdm(prompts, unit="prompt", desc=f"{'bench' if is_bench(cfg) else cfg.method.label} x {cfg.task.name}")
    for index, prompt in enumerate(bar):
        todo = [r for r in runs if not r.done(prompt)]
        if todo:
            decoders = in_run_order(decoders_for(todo, cfg), runs, cfg, index)
            gens = decode_prompt(model, prompt.input_ids, decoders, cfg, cfg.seed + index,
                                 cfg.max_new_tokens, cost_priors, profiles_to_measure(todo, cfg, cost_priors))
            ref = reference_of(gens, todo)
            for method_run in todo:
                sample = sample_of(method_run, prompt, gens[method_run.entry], ref, model, tokenizer)
                sample["run_position"] = list(decoders).index(method_run.entry)
                method_run.samples.append(sample)
                method_run.finished[sample_key(sample)] = sample
                method_run.tracker.log_prompt(index, sample)
        last = runs[-1].finished[(str(prompt.id), runs[-1].label)]
        bar.set_postfix_str(f"{last['tokens_per_s']:.1f} tok/s"
                            + (f", {last['speedup_vs_ar']:.2f}x" if last["speedup_vs_ar"] else ""))


def run_batches(model, tokenizer, prompts, runs: list[MethodRun], cfg: DictConfig, cost_priors: RunCalibration) -> None:
    """Decode `prompts` batch_size at a time, every method batched (AR too, the reference at the
    same batch size), in the batch's run order (drawn from its first prompt's index); record one sample
    per prompt. A batch with a prompt some method has not finished is decoded again for that method
    (its finished prompts are kept as they were)."""
    size = batch_size(cfg)
    batches = [list(range(i, min(i + size, len(prompts)))) for i in range(0, len(prompts), size)]
    for rows in tqdm(batches, desc=f"batches of {size} x {cfg.task.name}", unit="batch"):
        todo = [r for r in runs if not all(r.done(prompts[i]) for i in rows)]
        if not todo:
            continue
        decoders = in_run_order(decoders_for(todo, cfg), runs, cfg, rows[0])   # one order a batch
        gens = decode_batch(model, [prompts[i].input_ids for i in rows], decoders, cfg,
                            cfg.seed + rows[0], cfg.max_new_tokens, cost_priors,
                            profiles_to_measure(todo, cfg, cost_priors))
        ref = reference_of(gens, todo)
        for row, index in enumerate(rows):
            for method_run in todo:
                if method_run.done(prompts[index]):
                    continue
                own = gens[method_run.entry]
                sample = sample_of(method_run, prompts[index], own[row], ref[row] if ref else None, model, tokenizer)
                sample.update(batch_fields(own, ref if method_run.method != AR else own, row))
                sample["run_position"] = list(decoders).index(method_run.entry)
                method_run.samples.append(sample)
                method_run.finished[sample_key(sample)] = sample
                method_run.tracker.log_prompt(index, sample)


def model_dtype(model) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def open_results(run: MethodRun, device: str) -> None:
    """Create the method's folder, or resume the results it holds (same settings only)."""
    run.folder.mkdir(parents=True, exist_ok=True)
    run.resumed = check_resume(run.folder, resume_settings(run.cfg, device))
    run.finished = {sample_key(s): s for s in run.samples.load()}


def summary_of(run: MethodRun, samples: list[dict], *, device: str, model, warnings: list[str], started: str,
               shared_with: list[str], bench: dict | None, cost_prior=None, prefills_reused: int = 0,
               prefills_from_disk: int = 0,
               thread_choice=None, load: dict | None = None) -> dict:
    cfg = run.cfg
    prefill_shared = not hf_reference.is_reference(run.method) and len(shared_with) > 1
    return {
        "run": {**result_names(cfg), "method_name": cfg.method.name,
                "method_options": resolved_method_options(cfg.method.name, run.options),
                "ctx": cfg.ctx, "seed": cfg.seed, "num_prompts": cfg.num_prompts,
                "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature, "top_p": cfg.top_p,
                "stop_at_eos": cfg.stop_at_eos, "compare_ar": cfg.compare_ar, "dtype": cfg.dtype,
                "device": device, "output_dir": str(run.folder), "resumed": run.resumed, "warnings": warnings,
                "prefill_shared": prefill_shared, "prefill_shared_with": shared_with if prefill_shared else [],
                "prefills_reused": 0 if hf_reference.is_reference(run.method) else prefills_reused,
                "prefills_from_disk": 0 if hf_reference.is_reference(run.method) else prefills_from_disk,
                "batch_size": batch_size(cfg),
                "bench": bench, "cost_prior": cost_prior.as_dict() if cost_prior else None,
                "threads": thread_choice.as_dict() if thread_choice else None, "load": load,
                "wandb_dir": str(run.tracker.folder) if run.tracker.folder else None,
                "started": started, "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")},
        "metrics": {**aggregate(samples), **batch_metrics(samples)},
        "config": as_dict(cfg),
        "env": environment.collect(device=device, dtype=model_dtype(model)),
    }


def run(cfg: DictConfig, folder: Path, *, group: str | None = None) -> dict:
    """Run `cfg` into `folder`, resuming what a previous run of the same settings finished there.
    Returns the summary (of each method, by entry, for a benchmark). The folder stays locked while
    the run lives: a second run into it stops at once (ConfigError)."""
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    check_config(cfg)
    runs = method_runs(cfg, Path(folder))
    for method_run in runs:
        check_method_run(method_run)
    warnings = context_warnings(cfg)
    for warning in warnings:   # once, before anything loads; summary.json keeps them
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    device = device_name(cfg.device)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with hold_folder(folder):
        return run_in_held_folder(cfg, folder, runs, device=device, warnings=warnings, started=started, group=group)


def run_in_held_folder(cfg: DictConfig, folder: Path, runs: list[MethodRun], *, device: str, warnings: list[str],
                       started: str, group: str | None) -> dict:
    """`run` once the folder is checked and held: resume, load, decode the pending prompts, summarize."""
    for method_run in runs:
        open_results(method_run, device)
    torch.manual_seed(cfg.seed)
    busy_before = environment.cpu_busy_fraction()
    PREFILL_MEMO.resize(int(cfg.prefill_memo_gb * 2**30), cfg.prefill_cache_dir, int(cfg.prefill_cache_gb * 2**30))
    hits_before, disk_hits_before = PREFILL_MEMO.hits, PREFILL_MEMO.disk_hits

    model, tokenizer, prompts = load_inputs(cfg, device)
    pending = [p for p in prompts if not all(r.done(p) for r in runs)]
    for method_run in runs:
        if method_run.resumed:
            done = sum(method_run.done(p) for p in prompts)
            log.info("resuming %s in %s: %d of %d prompts already done", method_run.entry, method_run.folder, done,
                     len(prompts))
    shared_with = [r.entry for r in runs if not hf_reference.is_reference(r.method)]
    if cfg.compare_ar and not any(r.method == AR for r in runs):
        shared_with.insert(0, REFERENCE)
    summaries = {}
    try:
        for method_run in runs:
            method_run.tracker = make_tracker(as_dict(cfg.logger), config=as_dict(method_run.cfg),
                                              folder=method_run.folder, name=method_run.folder.name,
                                              group=cfg.experiment_name or group, several=len(runs) > 1)
        if pending and cfg.warmup:
            warm_up(model, pending[0], runs, cfg)
        cost_priors = RunCalibration()   # priors and threads by entry, measured on the first prefill each run decodes from
        if batch_size(cfg) > 1:
            run_batches(model, tokenizer, prompts, runs, cfg, cost_priors)
        else:
            run_prompts(model, tokenizer, prompts, runs, cfg, cost_priors)
        busy_after = environment.cpu_busy_fraction()
        load = {"cpu_busy_before": busy_before, "cpu_busy_after": busy_after,
                "noisy": environment.is_noisy(busy_before) or environment.is_noisy(busy_after)}
        bench = {"methods": [r.entry for r in runs], **load} if is_bench(cfg) else None
        for method_run in runs:
            samples = [method_run.finished[(str(p.id), method_run.label)] for p in prompts]
            summary = summary_of(method_run, samples, device=device, model=model, warnings=warnings, started=started,
                                 shared_with=shared_with, bench=bench, cost_prior=cost_priors.get(method_run.entry),
                                 prefills_reused=PREFILL_MEMO.hits - hits_before,
                                 prefills_from_disk=PREFILL_MEMO.disk_hits - disk_hits_before,
                                 thread_choice=cost_priors.choices.get(AR if method_run.method == AR else method_run.entry),
                                 load=load)
            write_json(method_run.folder / SUMMARY, summary)
            method_run.tracker.log_summary(summary)
            method_run.tracker.log_samples(samples)
            method_run.tracker.save_files([method_run.samples.path, method_run.folder / SUMMARY])
            summaries[method_run.entry] = (summary, samples)
    finally:
        for method_run in runs:
            if method_run.tracker is not None:
                method_run.tracker.finish()
    if not is_bench(cfg):
        summary, samples = summaries[runs[0].entry]
        print(format_table(summary["run"], summary["metrics"], samples, str(runs[0].folder)), flush=True)
        return summary
    print(format_bench_table({entry: s for entry, (s, _) in summaries.items()}, str(folder)), flush=True)
    return {entry: s for entry, (s, _) in summaries.items()}
