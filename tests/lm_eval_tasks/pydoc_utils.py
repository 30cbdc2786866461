"""Data loader and metric of the local lm-eval test tasks (see `pydoc_excerpts.yaml`)."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import datasets

DATA = Path(__file__).with_name("pydoc_excerpts.jsonl")


def load_excerpts(**_task_metadata) -> dict[str, datasets.Dataset]:
    """The committed excerpts as a one-split dataset; lm-eval passes task metadata, unused here."""
    with DATA.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return {"test": datasets.Dataset.from_list(rows)}


def words(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text.lower())


def word_f1(prediction: str, reference: str) -> float:
    pred, ref = Counter(words(prediction)), Counter(words(reference))
    common = sum((pred & ref).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(pred.values()), common / sum(ref.values())
    return 2 * precision * recall / (precision + recall)


def first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0].strip()


def process_continuation(doc: dict, results: list[str]) -> dict[str, float]:
    """`first_line_match`: the generated rest of the first line is exact; `word_f1` against the
    first len(generation) characters of the true continuation (the generation is capped in tokens)."""
    prediction, reference = results[0], doc["continuation"]
    return {"first_line_match": float(first_line(prediction) == first_line(reference)),
            "word_f1": word_f1(prediction, reference[:max(len(prediction), 1)])}
