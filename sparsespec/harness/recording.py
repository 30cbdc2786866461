"""Recording a run: each prompt's sample (samples.jsonl, the tracker), each method's summary.json,
and the table printed at the end.
"""
from __future__ import annotations

from datetime import datetime, timezone

from sparsespec import stats
from sparsespec.engine.eos import before_eos, eos_token_ids

from sparsespec.harness import environment
from sparsespec.harness.plan import MethodRun, result_names
from sparsespec.harness.report import format_bench_table, format_table
from sparsespec.harness.results import SUMMARY, aggregate, batch_metrics, build_sample, read_json, sample_key, write_json
from sparsespec.harness.run_config import AR, RunConfig
from sparsespec.harness.tracking import make_tracker


def text_of(tokens: list[int], tokenizer, model) -> str:
    """The decoded output, up to and without the first EOS (decoding may run past it, for timing)."""
    return tokenizer.decode(before_eos(tokens, eos_token_ids(model)), skip_special_tokens=True)


def sample_of(config: RunConfig, run: MethodRun, prompt, gen, ref, model, tokenizer) -> dict:
    """The samples.jsonl line of `run`'s method on `prompt` (`ref`: the AR decode, or None)."""
    if run.method == AR:
        ref = gen                                        # AR is its own reference
    text = text_of(gen.tokens, tokenizer, model)
    value = prompt.score(text) if prompt.reference is not None else None
    return build_sample(prompt=prompt, gen=gen, ref=ref if config.compare_ar or ref is gen else None,
                        names=result_names(config, run.spec), ctx=config.ctx, text=text, score=value,
                        greedy=config.greedy)


def batch_fields(gens, ref, row: int) -> dict:
    """What a sample of a batched run adds: the batch's throughput (decode tokens over decode time,
    summed over the batch) and batched AR's at the same batch size, their ratio and the batch's
    cost-model bound (AR: none), and where the prompt sat in the batch."""
    ar = ref.tokens_per_s if ref is not None else None
    return {"batch_size": gens.batch_size, "batch_row": row, "batch_decode_s": gens.decode_s,
            "batch_tokens_per_s": gens.tokens_per_s, "ar_batch_tokens_per_s": ar,
            "batch_speedup_vs_ar": stats.speedup(gens.tokens_per_s, ar),
            "batch_bound": None if gens is ref else stats.batch_bound([g.rounds for g in gens], ar)}


def record(run: MethodRun, index: int, sample: dict) -> None:
    """One finished sample, stamped with the code and machine that decoded it (a resumed folder may hold
    samples of several sittings): appended to the method's samples.jsonl, kept as finished, logged."""
    sample.update(run.stamp)
    run.samples.append(sample)
    run.finished[sample_key(sample)] = sample
    run.decoded += 1
    run.tracker.log_prompt(index, sample)


def open_trackers(runs: list[MethodRun], config: RunConfig, group: str | None) -> None:
    for run in runs:
        run.tracker = make_tracker(config.logger, config=run.spec.config, folder=run.spec.folder,
                                   name=run.spec.folder.name, group=config.experiment_name or group,
                                   several=len(runs) > 1)


def model_dtype(model) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def summary_of(config: RunConfig, run: MethodRun, samples: list[dict], *, model, started: str,
               shared_with: list[str], bench: dict | None, cost_prior=None, prefills_reused: int = 0,
               prefills_from_disk: int = 0,
               thread_choice=None, load: dict | None = None, ar_variants: dict | None = None) -> dict:
    spec = run.spec
    prefill_shared = not spec.is_reference and len(shared_with) > 1
    return {
        "run": {**result_names(config, spec), "method_name": spec.name, "method_options": spec.resolved,
                "ctx": config.ctx, "seed": config.seed, "num_prompts": config.num_prompts,
                "max_new_tokens": config.max_new_tokens, "temperature": config.temperature, "top_p": config.top_p,
                "stop_at_eos": config.stop_at_eos, "compare_ar": config.compare_ar, "dtype": config.dtype,
                "device": config.device, "output_dir": str(spec.folder), "resumed": run.resumed,
                "warnings": list(config.warnings),
                "prefill_shared": prefill_shared, "prefill_shared_with": shared_with if prefill_shared else [],
                "prefills_reused": 0 if spec.is_reference else prefills_reused,
                "prefills_from_disk": 0 if spec.is_reference else prefills_from_disk,
                "batch_size": config.batch_size,
                "bench": bench, "cost_prior": cost_prior.as_dict() if cost_prior else None,
                "threads": thread_choice.as_dict() if thread_choice else None, "load": load,
                "ar_variants": ar_variants,
                "wandb_dir": str(run.tracker.folder) if run.tracker.folder else None,
                "started": started, "finished": datetime.now(timezone.utc).isoformat(timespec="seconds")},
        "metrics": {**aggregate(samples), **batch_metrics(samples)},
        "config": spec.config,
        "env": environment.collect(device=config.device, dtype=model_dtype(model), git=run.git or None),
    }


def kept_summary(run: MethodRun) -> dict | None:
    """The summary.json of a resumed folder this sitting added nothing to: it already describes exactly
    these samples, and the sitting that decoded them (its code, threads, load), so it is kept as written.
    None when there is one to write (new samples, or none readable)."""
    if not run.resumed or run.decoded:
        return None
    return read_json(run.spec.folder / SUMMARY)


def write_summary(run: MethodRun, summary: dict, samples: list[dict]) -> None:
    """summary.json into the method's folder, and summary, samples and files to its tracker."""
    write_json(run.spec.folder / SUMMARY, summary)
    run.tracker.log_summary(summary)
    run.tracker.log_samples(samples)
    run.tracker.save_files([run.samples.path, run.spec.folder / SUMMARY])


def print_table(config: RunConfig, summaries: dict, folder) -> None:
    """The run's table (one method), or the benchmark's (every entry beside AR)."""
    if config.bench:
        print(format_bench_table({entry: s for entry, (s, _) in summaries.items()}, str(folder)), flush=True)
        return
    summary, samples = next(iter(summaries.values()))
    print(format_table(summary["run"], summary["metrics"], samples, summary["run"]["output_dir"]), flush=True)
