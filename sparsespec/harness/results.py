"""Result files of one run (schema: docs/CONTRACTS.md): samples.jsonl, summary.json, resume.json.

samples.jsonl gets one line per finished prompt, flushed and fsynced at once, so a killed run
loses nothing that finished and a re-run into the same folder resumes where it stopped.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict
from pathlib import Path

from sparsespec import stats
from sparsespec.errors import ConfigError

SAMPLES = "samples.jsonl"
SUMMARY = "summary.json"
RESUME = "resume.json"   # the settings that fix every sample; a resume must match them
RATIO_MEAN = "geometric"  # summary.json's mark that its ratios are log-scale means (older summaries lack it)


# --------------------------------------------------------------------------------------------
# samples.jsonl


class SamplesFile:
    """Append-only JSON lines, keyed by (prompt_id, method)."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / SAMPLES

    def load(self) -> list[dict]:
        """Every finished sample. A last line cut short by a kill is dropped (and cut from the file)."""
        if not self.path.exists():
            return []
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        complete, tail = lines[:-1], lines[-1]      # bytes after the last newline never finished
        if tail:
            with open(self.path, "r+b") as f:
                f.truncate(len(raw) - len(tail))
        samples = []
        for number, line in enumerate(complete, 1):
            if not line.strip():
                continue
            try:
                samples.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ConfigError(f"{self.path} line {number} is not valid JSON ({err.msg}); "
                                  f"fix or delete that line to resume") from None
        return samples

    def append(self, sample: dict) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(sample, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())


def sample_key(sample: dict) -> tuple[str, str]:
    return sample["prompt_id"], sample["method"]


# --------------------------------------------------------------------------------------------
# one sample


def build_sample(*, prompt, gen, ref, names: dict, ctx: int, text: str, score: float | None,
                 greedy: bool) -> dict:
    """One samples.jsonl line. `gen` is the method's Generation, `ref` the AR one (or None);
    for the AR method itself pass ref=gen: its reference is itself."""
    return {
        "prompt_id": str(prompt.id),
        "model": names["model"], "task": names["task"], "source": names["source"], "method": names["method"],
        "ctx": ctx,
        "context_tokens": gen.prompt_tokens,
        "new_tokens": len(gen.tokens),
        "prefill_s": gen.prefill_s,
        "decode_s": gen.decode_s,
        "tokens_per_s": gen.tokens_per_s,
        "mean_accepted": gen.mean_accepted,
        "acceptance_rate": gen.acceptance_rate,
        "time_split": gen.time_split(),
        "rounds": [asdict(r) for r in gen.rounds],
        "ar_tokens_per_s": ref.tokens_per_s if ref else None,
        "ar_decode_s": ref.decode_s if ref else None,
        "ar_prefill_s": ref.prefill_s if ref else None,
        "speedup_vs_ar": stats.speedup(gen.tokens_per_s, ref.tokens_per_s) if ref else None,
        "outputs_match_ar": (gen.tokens == ref.tokens) if (ref is not None and ref is not gen and greedy) else None,
        "text": text,
        "reference": prompt.reference,
        "score": score,
        "depth": getattr(prompt, "meta", {}).get("depth"),   # where the evidence sits (retrieval, qa), else None
    }


# --------------------------------------------------------------------------------------------
# aggregates


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def ar_decode_tokens(sample: dict) -> float:
    """Decode tokens of the sample's AR reference (tokens/s x seconds: AR emits one per round)."""
    return sample["ar_tokens_per_s"] * sample["ar_decode_s"]


def aggregate(samples: list[dict]) -> dict:
    """The summary metrics of docs/CONTRACTS.md, every one from `sparsespec.stats`: throughputs
    and the costs are pooled over prompts (sum of tokens over sum of seconds); the speed-up is the
    geometric mean of the per-prompt speed-ups with its 95% interval on the log scale, and the
    cost-model bound the geometric mean of the per-prompt bounds (`stats.geometric_ci`: ratios
    average on the log scale). Nulls are left out."""
    totals = stats.round_totals(r for s in samples for r in s["rounds"])
    decode_s = sum(s["decode_s"] for s in samples)
    with_ar = [s for s in samples if s["ar_tokens_per_s"] is not None and s["ar_decode_s"] is not None]
    ar_tokens = sum(ar_decode_tokens(s) for s in with_ar)
    ar_s = sum(s["ar_decode_s"] for s in with_ar)
    speedup = stats.geometric_ci(s["speedup_vs_ar"] for s in samples)
    bound = stats.geometric_ci(stats.prompt_bound(s["rounds"], stats.c_ar(s["ar_decode_s"], ar_decode_tokens(s)))
                               for s in with_ar).mean
    matches = [s["outputs_match_ar"] for s in samples if s["outputs_match_ar"] is not None]
    scores = [s["score"] for s in samples if s["score"] is not None and not math.isnan(s["score"])]
    return {
        "n_prompts": len(samples),
        "tokens_per_s": stats.tokens_per_s(totals.emitted, decode_s),
        "ar_tokens_per_s": stats.tokens_per_s(ar_tokens, ar_s) if with_ar else None,
        "ratio_mean": RATIO_MEAN,
        "speedup_vs_ar": speedup.mean,
        "speedup_vs_ar_log_std": speedup.std,
        "speedup_vs_ar_ci95_low": speedup.low,
        "speedup_vs_ar_ci95_high": speedup.high,
        "mean_accepted": stats.mean_accepted(totals.emitted, totals.rounds),
        "acceptance_rate": stats.acceptance_rate(totals.accepted, totals.drafted),
        "prefill_s_mean": _mean([s["prefill_s"] for s in samples]),
        "decode_s_mean": _mean([s["decode_s"] for s in samples]),
        "outputs_match_ar": _mean([float(m) for m in matches]),
        "score_mean": _mean(scores),
        "c_ar_s": stats.c_ar(ar_s, ar_tokens) if with_ar else None,
        **stats.cost_metrics(r for s in samples for r in s["rounds"]),
        "bound": bound,
        "bound_reached": stats.ratio(speedup.mean, bound),
    }


def batch_metrics(samples: list[dict]) -> dict:
    """A batched run's own metrics (nothing for batch size 1), from the one sample per batch that
    carries the batch (its row 0): the throughput, all batches' tokens over all their decode seconds
    (a short last batch weighs by its time, not as a full batch); batched AR's at the same batch size
    (mean over batches); the batch speed-up, the geometric mean over batches of each batch's ratio
    to batched AR on the same prompts, with its 95% interval on the log scale; the per-sequence
    latency (decode seconds until each sequence finished, mean over prompts; prefill excluded,
    reported as prefill_s); and the batched cost-model bound (geometric mean over batches) with the
    share of it reached."""
    batched = [s for s in samples if s.get("batch_size")]
    if not batched:
        return {}
    firsts = [s for s in batched if s["batch_row"] == 0]
    speedup = stats.geometric_ci(s["batch_speedup_vs_ar"] for s in firsts)
    ar = [s["ar_batch_tokens_per_s"] for s in firsts if s["ar_batch_tokens_per_s"] is not None]
    bound = stats.geometric_ci(s.get("batch_bound") for s in firsts).mean      # older runs: none
    return {"batch_size": batched[0]["batch_size"], "n_batches": len(firsts),
            "batch_tokens_per_s": stats.ratio(sum(s["batch_tokens_per_s"] * s["batch_decode_s"] for s in firsts),
                                              sum(s["batch_decode_s"] for s in firsts)),
            "n_sequences": len(batched),
            "ar_batch_tokens_per_s": _mean(ar),
            "batch_speedup_vs_ar": speedup.mean, "batch_speedup_vs_ar_ci95_low": speedup.low,
            "batch_speedup_vs_ar_ci95_high": speedup.high,
            "sequence_latency_s_mean": _mean([s["decode_s"] for s in batched]),
            "batch_bound": bound, "batch_bound_reached": stats.ratio(speedup.mean, bound)}


# --------------------------------------------------------------------------------------------
# summary.json and the resume guard


def write_json(path: Path, data: dict) -> None:
    """Write via a temporary file and one rename, so a reader never sees half a file."""
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> dict | None:
    """A JSON object written by write_json; None when missing, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):        # ValueError: JSONDecodeError and UnicodeDecodeError
        return None
    return data if isinstance(data, dict) else None


def check_resume(folder: Path, settings: dict) -> bool:
    """Record `settings` unless the folder holds finished samples; then insist they are unchanged.

    A folder without a finished sample takes any settings (a run that stopped on a bad input before
    its first sample leaves nothing to protect). Returns True when finished samples are resumed.
    """
    folder = Path(folder)
    finished = len(SamplesFile(folder).load())
    if not finished:
        write_json(folder / RESUME, settings)
        return False
    before = recorded_settings(folder, finished)
    if before != settings:
        changed = sorted(k for k in set(before) | set(settings) if before.get(k) != settings.get(k))
        detail = ", ".join(f"{k}: {before.get(k)!r} -> {settings.get(k)!r}" for k in changed)
        raise ConfigError(f"{folder} holds results of different settings ({detail}); "
                          f"resume with the same settings or choose another hydra.run.dir")
    return True


def recorded_settings(folder: Path, finished: int) -> dict:
    """The settings in resume.json; a one-line error when it is missing or unreadable, since then
    nobody can tell what the `finished` samples were made with."""
    path = Path(folder) / RESUME
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problem = "is missing"
    except (OSError, ValueError) as err:   # ValueError: JSONDecodeError and UnicodeDecodeError
        problem = f"is unreadable ({err})"
    else:
        if isinstance(settings, dict):
            return settings
        problem = f"holds a {type(settings).__name__}, not the settings object"
    raise ConfigError(f"{path} {problem}, so the settings of the {finished} finished sample(s) in {SAMPLES} "
                      f"are unknown; restore it, or move the folder's results away to start afresh "
                      f"(or choose another hydra.run.dir)")
