"""The short, readable table printed at the end of a run."""
from __future__ import annotations

import statistics


def _num(value, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def _mean_of(samples: list[dict], key: str) -> float | None:
    values = [s[key] for s in samples if s.get(key) is not None]
    return statistics.fmean(values) if values else None


def format_table(run: dict, metrics: dict, samples: list[dict], folder: str) -> str:
    method = run["method"]
    has_ar = metrics["ar_tokens_per_s"] is not None and method != "ar"
    header = (f"{method} on {run['model']} | {run['task']} ({run['source']}) | ctx {run['ctx']} "
              f"(~{_num(_mean_of(samples, 'context_tokens'), '{:.0f}')} prompt tokens) | "
              f"{metrics['n_prompts']} prompt(s) x {run['max_new_tokens']} new tokens")

    def ar(text: str) -> str:
        return text if has_ar else ""

    rows = [("", method, ar("ar")),
            ("decode tokens/s", _num(metrics["tokens_per_s"]), ar(_num(metrics["ar_tokens_per_s"]))),
            ("prefill s (mean)", _num(metrics["prefill_s_mean"]), ar(_num(_mean_of(samples, "ar_prefill_s")))),
            ("decode s (mean)", _num(metrics["decode_s_mean"]), ar(_num(_mean_of(samples, "ar_decode_s")))),
            ("tokens per round", _num(metrics["mean_accepted"]), ar("1.00")),
            ("acceptance rate", _num(metrics["acceptance_rate"], "{:.1%}"), "")]
    width = max(len(r[0]) for r in rows) + 2
    lines = [header] + [f"  {a:<{width}}{b:>12}{c:>12}" for a, b, c in rows]
    if has_ar:
        spread = (f" (per prompt {_num(metrics['speedup_vs_ar_mean'])} +/- {_num(metrics['speedup_vs_ar_std'])})"
                  if metrics["speedup_vs_ar_std"] is not None else "")
        lines.append(f"  {'speedup vs ar':<{width}}{_num(metrics['speedup_vs_ar'])}x{spread}")
        matches = [s["outputs_match_ar"] for s in samples if s["outputs_match_ar"] is not None]
        if matches:
            lines.append(f"  {'outputs match ar':<{width}}{sum(matches)}/{len(matches)} prompts")
    if metrics["score_mean"] is not None:
        lines.append(f"  {'task score (mean)':<{width}}{_num(metrics['score_mean'], '{:.3f}')}")
    lines.append(f"  results: {folder}")
    return "\n".join(lines)
