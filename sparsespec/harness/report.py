"""The short, readable table printed at the end of a run."""
from __future__ import annotations

import statistics

from sparsespec import stats
from sparsespec.tables import format_cell, markdown_table

NOTHING = "–"          # a statistic that does not exist for the row (acceptance of a run that drafted nothing)


def _mean_of(samples: list[dict], key: str) -> float | None:
    values = [s[key] for s in samples if s.get(key) is not None]
    return statistics.fmean(values) if values else None


def interval(low: float, high: float) -> str:
    """`[1.30, 1.46]`: brackets and a comma, so a bound never reads as a range with a minus sign."""
    return f"[{low:.2f}, {high:.2f}]"


def ratio_text(metrics: dict, key: str) -> str:
    """`1.52x [1.20, 1.93]`: the ratio `key` (a geometric mean) and its 95% interval (`key`_ci95_low
    and _high); `1.52x` without an interval (one prompt or batch); `–` without a value."""
    value, low, high = (metrics.get(k) for k in (key, f"{key}_ci95_low", f"{key}_ci95_high"))
    if value is None:
        return NOTHING
    return f"{value:.2f}x" + (f" {interval(low, high)}" if low is not None and high is not None else "")


def speedup_line(metrics: dict) -> str:
    """`1.52x [1.20, 1.93] (geometric mean over 5 prompts, 95% CI on the log scale)`; one prompt gives
    its speed-up and says that there is no interval."""
    n = metrics["n_prompts"]
    interval_known = metrics.get("speedup_vs_ar_ci95_low") is not None
    how = (f"geometric mean over {n} prompts, 95% CI on the log scale" if interval_known
           else f"{n} prompt{'s' * (n != 1)}: no interval below 2 prompts")
    return f"{ratio_text(metrics, 'speedup_vs_ar')} ({how})"


def drafted_anything(metrics: dict) -> bool:
    """Whether any round verified a draft token: `c_verify_s_by_k` is keyed by the drafts a round
    verified, so a run that drafted nothing has only k = 0 (a summary without the key counts as drafting)."""
    by_k = metrics.get("c_verify_s_by_k")
    return by_k is None or any(int(k) > 0 for k in by_k)


def acceptance_cell(method: str, metrics: dict, drafted: bool | None = None) -> str:
    """The acceptance rate, or `–` for AR and for a run that drafted nothing (0.0% would claim every
    draft token was rejected). `drafted`: known from the samples, else read from the metrics."""
    drafted = drafted_anything(metrics) if drafted is None else drafted
    if method == "ar" or not drafted:
        return NOTHING
    return format_cell(metrics["acceptance_rate"], ".1%")


def format_table(run: dict, metrics: dict, samples: list[dict], folder: str) -> str:
    method = run["method"]
    has_ar = metrics["ar_tokens_per_s"] is not None and method != "ar"
    shared = ", shared" if run.get("prefill_shared") else ""
    header = (f"{method} on {run['model']} | {run['task']} ({run['source']}) | ctx {run['ctx']} "
              f"(~{format_cell(_mean_of(samples, 'context_tokens'), '.0f')} prompt tokens) | "
              f"{metrics['n_prompts']} prompt(s) x {run['max_new_tokens']} new tokens")
    rows = [("decode tokens/s", metrics["tokens_per_s"], metrics["ar_tokens_per_s"]),
            (f"prefill s (mean{shared})", metrics["prefill_s_mean"], _mean_of(samples, "ar_prefill_s")),
            ("decode s (mean)", metrics["decode_s_mean"], _mean_of(samples, "ar_decode_s")),
            ("tokens per round", metrics["mean_accepted"], 1.0),
            ("acceptance rate", metrics["acceptance_rate"], None)]
    columns = ["", method] + (["ar"] if has_ar else [])
    records = [dict(zip(columns, row)) for row in rows]
    formats = {method: ".2f", "ar": ".2f"}
    drafted = stats.round_totals(r for s in samples for r in s.get("rounds") or []).drafted > 0
    records[-1][method] = acceptance_cell(method, metrics, drafted)
    lines = [header, markdown_table(records, columns, formats)]
    if has_ar:
        lines.append(f"speedup vs ar: {speedup_line(metrics)}")
        matches = [s["outputs_match_ar"] for s in samples if s["outputs_match_ar"] is not None]
        if matches:
            lines.append(f"outputs match ar: {sum(matches)}/{len(matches)} prompts")
    if metrics.get("bound") is not None:
        lines.append(f"cost-model bound: {metrics['bound']:.2f}x ({metrics['bound_reached']:.0%} reached)")
    if metrics["score_mean"] is not None:
        lines.append(f"task score (mean): {metrics['score_mean']:.3f}")
    lines += [line for line in (threads_line(run.get("threads")), busy_line(run.get("load"))) if line]
    lines.append(f"results: {folder}")
    return "\n".join(lines)


def busy_line(load: dict | None) -> str | None:
    """A warning when other processes used the CPU around the run (`noisy`); None on a quiet machine."""
    if not load or not load.get("noisy"):
        return None
    shares = "/".join(format_cell(load.get(k), ".0%") for k in ("cpu_busy_before", "cpu_busy_after"))
    return f"machine busy: other processes used {shares} of the CPU before/after the run; speeds are not quiet-machine figures"


def threads_line(choice: dict | None) -> str | None:
    """`threads: 1 (measured C_AR: 1 -> 12.1 ms, 2 -> 20.3 ms)`; None when nothing was measured."""
    if not choice:
        return None
    costs = ", ".join(f"{t} -> {s * 1e3:.1f} ms" for t, s in choice["cost_s"].items())
    return f"threads: {choice['threads']} (measured {choice['measured']}: {costs})"


BENCH_COLUMNS = {"method": "method", "tokens_per_s": "tok/s", "speedup": "speed-up (geo. mean, 95% CI)",
                 "mean_accepted": "tokens/round", "acceptance_rate": "acceptance", "outputs_match_ar": "match AR",
                 "c_draft_ms": "C_d ms", "c_verify_ms": "C_v ms", "bound": "bound", "bound_reached": "reached",
                 "prefill_s_mean": "prefill s", "threads": "threads"}


def bench_row(entry: str, summary: dict) -> dict:
    m = summary["metrics"]
    row = {"method": entry, "tokens_per_s": format_cell(m["tokens_per_s"], ".2f"),
           "speedup": ratio_text(m, "speedup_vs_ar"),
           "mean_accepted": format_cell(m["mean_accepted"], ".2f"),
           "acceptance_rate": acceptance_cell((summary.get("run") or {}).get("method", entry), m),
           "outputs_match_ar": format_cell(m["outputs_match_ar"], ".0%"),
           "c_draft_ms": format_cell(m["c_draft_s"] and m["c_draft_s"] * 1e3, ".1f"),
           "c_verify_ms": format_cell(m["c_verify_s"] and m["c_verify_s"] * 1e3, ".1f"),
           "bound": format_cell(m["bound"], ".2f"), "bound_reached": format_cell(m["bound_reached"], ".0%"),
           "prefill_s_mean": format_cell(m["prefill_s_mean"], ".2f"),
           "threads": format_cell((summary["run"].get("threads") or {}).get("threads"), "d")}
    if m.get("batch_size"):       # a batched run: throughput over the batch against batched AR
        row.update(batch_tokens_per_s=format_cell(m["batch_tokens_per_s"], ".2f"),
                   batch_speedup=ratio_text(m, "batch_speedup_vs_ar"),
                   latency_s=format_cell(m["sequence_latency_s_mean"], ".2f"))
    return {{**BENCH_COLUMNS, **BATCH_COLUMNS}[k]: v for k, v in row.items()}


BATCH_COLUMNS = {"batch_tokens_per_s": "batch tok/s",
                 "batch_speedup": "batch speed-up vs batched AR (geo. mean, 95% CI)",
                 "latency_s": "latency s (per sequence)"}


def format_bench_table(summaries: dict[str, dict], folder: str) -> str:
    """One line per method of a side-by-side benchmark (AR first), then where the results are."""
    first = next(iter(summaries.values()))["run"]
    size = first.get("batch_size") or 1
    shared = ("one prefill a prompt, shared by the engine's methods" if first.get("prefill_shared")
              else "each method prefilling its own prompts")
    if size > 1:
        shared = f"batch size {size}, {shared}"
    header = (f"benchmark on {first['model']} | {first['task']} ({first['source']}) | ctx {first['ctx']} | "
              f"{first['num_prompts']} prompt(s) x {first['max_new_tokens']} new tokens; {shared}; C_AR {format_cell(next(iter(summaries.values()))['metrics']['c_ar_s'], '.4f')} s")
    rows = [bench_row(entry, summary) for entry, summary in summaries.items()]
    columns = [*BENCH_COLUMNS.values(), *(BATCH_COLUMNS.values() if size > 1 else ())]
    busy = busy_line(first.get("bench"))
    return "\n".join([header, markdown_table(rows, columns), *([busy] if busy else []),
                      f"results: {folder}/<method>/ (samples.jsonl, summary.json)"])
