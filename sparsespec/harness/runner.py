"""One run: check the config, load the model and prompts, decode every prompt with the method
(and with AR for reference), write samples.jsonl / summary.json, log to the tracker, print a table.
"""
from __future__ import annotations

import logging
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from omegaconf import DictConfig
from tqdm import tqdm

from sparsespec.eos import before_eos, eos_token_ids
from sparsespec.errors import ConfigError

from . import environment
from .checks import (as_dict, check_config, check_context_fits, context_warnings, device_name, method_options,
                     model_spec, resolved_options)
from .report import format_table
from .results import SUMMARY, SamplesFile, aggregate, build_sample, check_resume, sample_key, write_json
from .tracking import make_tracker

log = logging.getLogger(__name__)

WARMUP_TOKENS = 16   # enough for a few draft/verify rounds; the warm-up output is thrown away


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
            "dtype": cfg.dtype, "device": device}


# --------------------------------------------------------------------------------------------
# loading


def load_inputs(cfg: DictConfig, device: str):
    """(model, tokenizer, prompts), with a progress bar over the two loads."""
    from sparsespec.models import load_model, max_context
    from sparsespec.tasks import load_prompts

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
                               path=cfg.task.path, subset=cfg.task.subset, **fill)
        bar.update()
    if not prompts:
        raise ConfigError(f"task {cfg.task.name} (source={cfg.task.source}) produced no prompts at ctx={cfg.ctx}")
    return model, tokenizer, prompts


# --------------------------------------------------------------------------------------------
# decoding one prompt


def decode(model, prompt, cfg: DictConfig, method: str, options: dict, seed: int, max_new_tokens: int):
    from sparsespec import generate

    return generate(model, prompt.input_ids, method=method, max_new_tokens=max_new_tokens,
                    temperature=cfg.temperature, top_p=cfg.top_p, seed=seed,
                    stop_at_eos=cfg.stop_at_eos, **options)


def model_dtype(model) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def text_of(tokens: list[int], tokenizer, model) -> str:
    """The decoded output, up to and without the first EOS (decoding may run past it, for timing)."""
    return tokenizer.decode(before_eos(tokens, eos_token_ids(model)), skip_special_tokens=True)


def run_prompt(model, tokenizer, prompt, cfg: DictConfig, options: dict, seed: int) -> dict:
    """Decode `prompt` with the method and, unless switched off, with AR; return its sample."""
    gen = decode(model, prompt, cfg, cfg.method.name, options, seed, cfg.max_new_tokens)
    if cfg.method.name == "ar":
        ref = gen
    elif cfg.compare_ar:
        ref = decode(model, prompt, cfg, "ar", {}, seed, cfg.max_new_tokens)
    else:
        ref = None
    text = text_of(gen.tokens, tokenizer, model)
    value = prompt.score(text) if prompt.reference is not None else None
    return build_sample(prompt=prompt, gen=gen, ref=ref, names=result_names(cfg), ctx=cfg.ctx, text=text,
                        score=value, greedy=cfg.temperature == 0)


def warm_up(model, prompt, cfg: DictConfig, options: dict) -> None:
    """One short untimed generation per method used, so one-off costs do not land on prompt 1."""
    start = time.perf_counter()
    max_new = min(WARMUP_TOKENS, cfg.max_new_tokens)
    decode(model, prompt, cfg, cfg.method.name, options, cfg.seed, max_new)
    if cfg.compare_ar and cfg.method.name != "ar":
        decode(model, prompt, cfg, "ar", {}, cfg.seed, max_new)
    log.info("warm-up (%d new tokens, not recorded): %.1f s", max_new, time.perf_counter() - start)


# --------------------------------------------------------------------------------------------
# the run


def run(cfg: DictConfig, folder: Path, *, group: str | None = None) -> dict:
    """Run `cfg` into `folder`, resuming what a previous run of the same settings finished there."""
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    check_config(cfg)
    warnings = context_warnings(cfg)
    for warning in warnings:   # once, before anything loads; summary.json keeps them
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    device = device_name(cfg.device)
    options = method_options(cfg)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    resumed = check_resume(folder, resume_settings(cfg, device))
    samples_file = SamplesFile(folder)
    finished = {sample_key(s): s for s in samples_file.load()}
    torch.manual_seed(cfg.seed)

    model, tokenizer, prompts = load_inputs(cfg, device)
    label = cfg.method.label
    pending = [p for p in prompts if (str(p.id), label) not in finished]
    if resumed:
        log.info("resuming in %s: %d of %d prompts already done", folder, len(prompts) - len(pending), len(prompts))

    tracker = make_tracker(as_dict(cfg.logger), config=as_dict(cfg), folder=folder, name=folder.name,
                           group=cfg.experiment_name or group)
    try:
        if pending and cfg.warmup:
            warm_up(model, pending[0], cfg, options)
        bar = tqdm(prompts, desc=f"{label} x {cfg.task.name}", unit="prompt")
        for index, prompt in enumerate(bar):
            key = (str(prompt.id), label)
            if key not in finished:
                finished[key] = run_prompt(model, tokenizer, prompt, cfg, options, seed=cfg.seed + index)
                samples_file.append(finished[key])
                tracker.log_prompt(index, finished[key])
            sample = finished[key]
            bar.set_postfix_str(f"{sample['tokens_per_s']:.1f} tok/s"
                                + (f", {sample['speedup_vs_ar']:.2f}x" if sample["speedup_vs_ar"] else ""))
        samples = [finished[(str(p.id), label)] for p in prompts]
        metrics = aggregate(samples)
        summary = {
            "run": {**result_names(cfg), "method_name": cfg.method.name,
                    "method_options": resolved_options(cfg.method.name, options),
                    "ctx": cfg.ctx, "seed": cfg.seed, "num_prompts": cfg.num_prompts,
                    "max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature, "top_p": cfg.top_p,
                    "stop_at_eos": cfg.stop_at_eos, "compare_ar": cfg.compare_ar, "dtype": cfg.dtype,
                    "device": device, "output_dir": str(folder), "resumed": resumed, "warnings": warnings,
                    "wandb_dir": str(tracker.folder) if tracker.folder else None,
                    "started": started, "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")},
            "metrics": metrics,
            "config": as_dict(cfg),
            "env": environment.collect(device=device, dtype=model_dtype(model)),
        }
        write_json(folder / SUMMARY, summary)
        tracker.log_summary(summary)
        tracker.log_samples(samples)
        tracker.save_files([samples_file.path, folder / SUMMARY])
    finally:
        tracker.finish()
    print(format_table(summary["run"], metrics, samples, str(folder)), flush=True)
    return summary
