"""Decoding a run: load the model and prompts, then for each batch of `batch_size` prompts (one
prompt is a batch of one) prefill each prompt once, measure any cost profiles still missing from that
prefill, decode every method back to back in the batch's run order, and record one sample a prompt
and method (recording.py).
"""
from __future__ import annotations

import logging
import time

import torch
from tqdm import tqdm

import sparsespec
from sparsespec import hf_reference, threads
from sparsespec.engine.loop import one_after_another
from sparsespec.errors import ConfigError
from sparsespec.models import load_model, max_context
from sparsespec.engine.prefill import PrefillMemo
from sparsespec.tasks import load_prompts

from sparsespec.harness import calibration
from sparsespec.harness.calibration import RunCalibration
from sparsespec.harness.checks import check_context_fits
from sparsespec.harness.plan import (MethodRun, batches, decoders_for, in_run_order, profiles_to_measure, reference_of)
from sparsespec.harness.recording import batch_fields, record, sample_of
from sparsespec.harness.run_config import AR, RunConfig

log = logging.getLogger(__name__)

WARMUP_TOKENS = 16    # enough for a few draft/verify rounds; the warm-up output is thrown away
WARMUP_PREFIX = 2048  # warm up on the prompt's first tokens: every code path, without a long prefill

# Prefills kept across the runs of this process (`prefill_memo_gb`): the jobs of a Hydra multirun on
# the basic launcher decode one after another here, so a batch-size sweep prefills each prompt once.
PREFILL_MEMO = PrefillMemo()


def load_inputs(config: RunConfig):
    """(model, tokenizer, prompts), with a progress bar over the two loads."""
    task = config.task
    with tqdm(total=2, desc="loading", unit="step") as bar:
        bar.set_postfix_str(f"model {config.model.name} ({config.dtype}, {config.device})")
        model, tokenizer = load_model(config.model.spec, dtype=config.dtype, device=config.device)
        check_context_fits(config.ctx, config.max_new_tokens, config.model.name, max_context(model, config.model.spec))
        bar.update()
        bar.set_postfix_str(f"{config.num_prompts} {task.name} prompts from {task.source}")
        fill = {} if task.min_fill is None else {"min_fill": task.min_fill}
        prompts = load_prompts(task.name, source=task.source, tokenizer=tokenizer, context_tokens=config.ctx,
                               num_prompts=config.num_prompts, seed=config.seed, path=task.path, subset=task.subset,
                               **fill, **task.loader_options())
        bar.update()
    if not prompts:
        raise ConfigError(f"task {task.name} (source={task.source}) produced no prompts at ctx={config.ctx}")
    return model, tokenizer, prompts


def measure_profiles(model, prompts: list, starts: list[dict], profiles: dict, cost_priors: RunCalibration) -> None:
    """Measure every job of `profiles` on `prompts` from its start in `starts` (each prompt's prefill:
    label -> Prefilled) into `cost_priors` (priors and thread choices by entry)."""
    if not profiles:
        return
    start = time.perf_counter()
    calibration.measure_planned(model, prompts, starts, profiles, cost_priors)
    log.info("%d calibration decodes (from the shared prefill; not recorded as samples): %.1f s; threads %s",
             len(profiles), time.perf_counter() - start, {e: c.threads for e, c in cost_priors.choices.items()})


def prefill(model, prompt, engine: dict, profiles: dict, max_new_tokens: int) -> dict:
    """One prefill of `prompt` for the engine's decoders and the cost profiles (each at its own length)."""
    methods = {**engine, **{label: (job.method, job.options) for label, job in profiles.items()}}
    return sparsespec.prefill(model, prompt, methods=methods, max_new_tokens=max_new_tokens,
                              lengths={label: job.length for label, job in profiles.items()}, memo=PREFILL_MEMO)


def decode_batch(model, inputs: list, decoders: dict[str, tuple[str, dict]], config: RunConfig, seed: int,
                 max_new_tokens: int, cost_priors: RunCalibration | None = None, profiles: dict | None = None) -> dict:
    """label -> BatchGenerations (one Generation per prompt of `inputs`) for every decoder (label ->
    (method, options)), back to back in the given order. sparsespec's methods decode the batch
    together (sparsespec/engine/loop.py), all from one shared prefill of each prompt: N methods cost one
    prefill a prompt, not N. transformers' reference decoders decode its prompts one after another.
    `profiles` (plan.profiles_to_measure) are measured first, from the same prefills: a batch's
    controller weighs a batch's costs. A run of batch_size 1 calls the library's one-prompt form."""
    cost_priors = RunCalibration() if cost_priors is None else cost_priors
    profiles = profiles or {}
    one = config.batch_size == 1
    prompts = [torch.as_tensor(ids).view(-1) for ids in inputs]
    engine = {label: d for label, d in decoders.items() if not hf_reference.is_reference(d[0])}
    starts = [prefill(model, p, engine, profiles, max_new_tokens) if engine or profiles else {} for p in prompts]
    measure_profiles(model, prompts, starts, profiles, cost_priors)
    common = dict(temperature=config.temperature, top_p=config.top_p, seed=seed, stop_at_eos=config.stop_at_eos)
    gens = {}
    for label, (method, options) in decoders.items():
        count = cost_priors.threads_for(label, method)
        if label not in engine:
            with threads.using(count):
                gens[label] = one_after_another([hf_reference.hf_generate(
                    model, p, method=method, max_new_tokens=max_new_tokens, **common, **options) for p in prompts])
            continue
        # the probe's count: where the online rule starts, or the count for the whole generation
        counts = (dict(threads="auto", thread_prior=count) if config.online_threads
                  else dict(threads=count or torch.get_num_threads()))
        if one:
            gens[label] = one_after_another([sparsespec.generate(
                model, prompts[0], prefilled=starts[0].pop(label), cost_prior=cost_priors.get(label),
                ar_attention=cost_priors.ar_attention, remember=False, **counts, **common)])
        else:
            gens[label] = sparsespec.generate(model, prompts, prefilled=[s.pop(label) for s in starts],
                                              cost_prior=cost_priors.get(label),
                                              ar_attention=cost_priors.ar_attention, remember=False, **counts,
                                              **common)
    return gens


def warm_up(model, prompt, runs: list[MethodRun], config: RunConfig) -> None:
    """One short untimed generation of every method on batch_size copies of the prompt's first
    WARMUP_PREFIX tokens, so one-off costs (kernels, draft-weight copies) do not land on the first
    batch. A draft budget that does not fit that prefix warms up on the whole prompt instead."""
    start = time.perf_counter()
    max_new = min(WARMUP_TOKENS, config.max_new_tokens)
    decoders = decoders_for([r for r in runs if not r.done(prompt)], config)
    ids = torch.as_tensor(prompt.input_ids).view(-1)
    with PREFILL_MEMO.paused():  # a warm-up prefill is neither kept nor served: the first batch's own stays timed
        try:
            decode_batch(model, [ids[:WARMUP_PREFIX]] * config.batch_size, decoders, config, config.seed, max_new)
        except ConfigError:
            decode_batch(model, [ids] * config.batch_size, decoders, config, config.seed, max_new)
    log.info("warm-up (%d methods x %d new tokens, not recorded): %.1f s", len(decoders), max_new,
             time.perf_counter() - start)


def decode_all(model, tokenizer, prompts, runs: list[MethodRun], config: RunConfig, cost_priors: RunCalibration) -> None:
    """Decode `prompts` batch_size at a time, every unfinished method from one shared prefill of each
    prompt, in the batch's run order (drawn from its first prompt's index); record one sample per
    prompt and method, with its place in that order (`run_position`). A batch with a prompt some
    method has not finished is decoded again for that method (its finished prompts are kept as they
    were). The bar shows the speed and speed-up of the run's headline method (`shown_run`)."""
    desc = f"{'bench' if config.bench else runs[0].label} x {config.task.name}"
    if config.batch_size > 1:
        desc = f"batches of {config.batch_size} x {config.task.name}"
    # (rows, runs not done with them) per batch; batches share no prompt, so decoding one leaves the rest as listed
    plan = [(rows, [r for r in runs if not all(r.done(prompts[i]) for i in rows)])
            for rows in batches(len(prompts), config.batch_size)]
    kept = sum(not todo for _, todo in plan)        # a resumed run's finished batches: the bar starts there
    shown = shown_run(runs)
    with tqdm(total=len(plan), initial=kept, unit="prompt" if config.batch_size == 1 else "batch", desc=desc) as bar:
        for rows, todo in plan:
            if not todo:
                continue
            decode_rows(model, tokenizer, prompts, rows, todo, runs, config, cost_priors)
            bar.set_postfix_str(progress_text(shown.finished[(str(prompts[rows[-1]].id), shown.label)],
                                              shown.label if len(runs) > 1 else None), refresh=False)
            bar.update(1)


def shown_run(runs: list[MethodRun]) -> MethodRun:
    """The run a progress bar follows: SparseSpec-L with its default controller where the run decodes
    it (the matrix's headline, not whichever baseline happens to run last), else the first method that
    is not AR, else AR."""
    return next((r for r in runs if r.label == "sparsespec"), None) or next(
        (r for r in runs if r.method != AR), runs[0])


def progress_text(sample: dict, label: str | None) -> str:
    """`sparsespec 12.3 tok/s, 1.45x`: the last decoded prompt's speed and speed-up over AR (label: when
    the bar decodes several methods)."""
    speed = f"{sample['tokens_per_s']:.1f} tok/s" + (f", {sample['speedup_vs_ar']:.2f}x" if sample["speedup_vs_ar"] else "")
    return f"{label} {speed}" if label else speed


def decode_rows(model, tokenizer, prompts, rows: list[int], todo: list[MethodRun], runs: list[MethodRun],
                config: RunConfig, cost_priors: RunCalibration) -> None:
    """Decode the batch of `prompts[rows]` with each run of `todo`; record the prompts each has not finished."""
    decoders = in_run_order(decoders_for(todo, config), runs, config, rows[0])   # one order a batch
    gens = decode_batch(model, [prompts[i].input_ids for i in rows], decoders, config, config.seed + rows[0],
                        config.max_new_tokens, cost_priors, profiles_to_measure(todo, config, cost_priors))
    ref = reference_of(gens, todo)
    for row, index in enumerate(rows):
        for run in todo:
            if run.done(prompts[index]):
                continue
            own = gens[run.entry]
            sample = sample_of(config, run, prompts[index], own[row], ref[row] if ref is not None else None,
                               model, tokenizer)
            if config.batch_size > 1:   # batch 1: the sample's fields as before batching
                sample.update(batch_fields(own, own if run.method == AR else ref, row))
            sample["run_position"] = list(decoders).index(run.entry)
            record(run, index, sample)
