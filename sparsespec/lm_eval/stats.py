"""Speculation statistics of lm-eval generation requests: per-request records, aggregates, a table.

Aggregates use the definitions of `sparsespec.stats`, as the harness does: `tokens_per_s`,
`mean_accepted` and `acceptance_rate` are pooled over every round of every request;
`prefill_s_mean` and `decode_s_mean` are means across requests.
"""
from __future__ import annotations

from collections import defaultdict
from statistics import fmean

from sparsespec import stats
from sparsespec.tables import markdown_table

MEAN_FIELDS = ("prefill_s", "decode_s")


def request_record(request, generation, text: str) -> dict:
    """One lm-eval `Instance` and the `Generation` that answered it."""
    return {"task": request.task_name, "doc_id": request.doc_id,
            "prompt_tokens": generation.prompt_tokens, "new_tokens": len(generation.tokens),
            "rounds": len(generation.rounds), "decode_tokens": generation.decode_tokens,
            "drafted": generation.totals.drafted, "accepted": generation.totals.accepted,
            "prefill_s": generation.prefill_s, "decode_s": generation.decode_s,
            "tokens_per_s": generation.tokens_per_s, "mean_accepted": generation.mean_accepted,
            "acceptance_rate": generation.acceptance_rate, "time_split": generation.time_split(),
            "text_chars": len(text)}


def aggregate(records: list[dict]) -> dict:
    if not records:
        return {"n_requests": 0}
    decode_tokens = sum(r["decode_tokens"] for r in records)
    return {"n_requests": len(records),
            "new_tokens": sum(r["new_tokens"] for r in records),
            "tokens_per_s": stats.tokens_per_s(decode_tokens, sum(r["decode_s"] for r in records)),
            "mean_accepted": stats.mean_accepted(decode_tokens, sum(r["rounds"] for r in records)),
            "acceptance_rate": stats.acceptance_rate(sum(r["accepted"] for r in records),
                                                     sum(r["drafted"] for r in records)),
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


TABLE_COLUMNS = {"task": "task", "n_requests": "requests", "new_tokens": "new tokens",
                 "tokens_per_s": "tokens/s", "mean_accepted": "mean accepted",
                 "acceptance_rate": "acceptance rate", "prefill_s_mean": "prefill s (mean)",
                 "decode_s_mean": "decode s (mean)"}
TABLE_FORMATS = {"tokens/s": ".2f", "mean accepted": ".2f", "acceptance rate": ".3f",
                 "prefill s (mean)": ".3f", "decode s (mean)": ".3f"}


def format_table(speculation: dict) -> str:
    """A markdown table, one row per task and one for all requests together."""
    options = ",".join(f"{k}={v}" for k, v in sorted(speculation["options"].items()))
    rows = list(speculation["by_task"].items()) + [("all", speculation["aggregate"])]
    records = [{TABLE_COLUMNS[k]: v for k, v in {"task": task, **agg}.items() if k in TABLE_COLUMNS}
               for task, agg in rows if agg["n_requests"]]
    title = (f"sparsespec speculation statistics, method={speculation['method']}"
             + (f" ({options})" if options else ""))
    return title + "\n\n" + markdown_table(records, TABLE_COLUMNS.values(), TABLE_FORMATS)
