"""Speculation statistics of lm-eval generation requests: per-request records, aggregates, a table.

Aggregates follow the harness's convention (docs/CONTRACTS.md): `tokens_per_s` is pooled (decode
tokens over decode seconds, all requests together); `*_mean` are plain means across requests.
"""
from __future__ import annotations

from collections import defaultdict
from statistics import fmean

MEAN_FIELDS = ("tokens_per_s", "mean_accepted", "acceptance_rate", "prefill_s", "decode_s", "new_tokens")


def request_record(request, generation, text: str) -> dict:
    """One lm-eval `Instance` and the `Generation` that answered it."""
    return {"task": request.task_name, "doc_id": request.doc_id,
            "prompt_tokens": generation.prompt_tokens, "new_tokens": len(generation.tokens),
            "rounds": len(generation.rounds), "decode_tokens": generation.decode_tokens,
            "prefill_s": generation.prefill_s, "decode_s": generation.decode_s,
            "tokens_per_s": generation.tokens_per_s, "mean_accepted": generation.mean_accepted,
            "acceptance_rate": generation.acceptance_rate, "time_split": generation.time_split(),
            "text_chars": len(text)}


def aggregate(records: list[dict]) -> dict:
    if not records:
        return {"n_requests": 0}
    decode_tokens = sum(r["decode_tokens"] for r in records)
    decode_s = sum(r["decode_s"] for r in records)
    return {"n_requests": len(records),
            "new_tokens": sum(r["new_tokens"] for r in records),
            "tokens_per_s": decode_tokens / decode_s if decode_s > 0 else 0.0,
            **{f"{key}_mean": fmean(r[key] for r in records) for key in MEAN_FIELDS}}


def report(method: str, options: dict, records: list[dict], resolved_options: dict | None = None) -> dict:
    """`options` as given in model_args; `resolved_options` with the method's defaults filled in."""
    by_task = defaultdict(list)
    for record in records:
        by_task[record["task"]].append(record)
    return {"method": method, "options": dict(options), "resolved_options": resolved_options,
            "aggregate": aggregate(records),
            "by_task": {task: aggregate(rs) for task, rs in sorted(by_task.items())},
            "requests": records}


def format_table(speculation: dict) -> str:
    """A markdown table, one row per task and one for all requests together."""
    options = ",".join(f"{k}={v}" for k, v in sorted(speculation["options"].items()))
    header = ("|task|requests|new tokens|tokens/s|mean accepted|acceptance rate|prefill s (mean)|"
              "decode s (mean)|")
    lines = [f"sparsespec speculation statistics, method={speculation['method']}"
             + (f" ({options})" if options else ""), "", header, "|" + "---|" * 8]
    rows = list(speculation["by_task"].items()) + [("all", speculation["aggregate"])]
    for task, agg in rows:
        if agg["n_requests"]:
            lines.append(f"|{task}|{agg['n_requests']}|{agg['new_tokens']}|{agg['tokens_per_s']:.2f}|"
                         f"{agg['mean_accepted_mean']:.2f}|{agg['acceptance_rate_mean']:.3f}|"
                         f"{agg['prefill_s_mean']:.3f}|{agg['decode_s_mean']:.3f}|")
    return "\n".join(lines)
