"""Task metrics, following LongBench: token F1 for QA, ROUGE-L for summaries, edit similarity for
code, and the chosen letter for LongBench v2's multiple choice; exact match of the expected items
for the synthetic retrieval task (RULER's string_match_all). Each returns a float in [0, 1]."""
from __future__ import annotations

import difflib
import re
import string
from collections import Counter
from collections.abc import Sequence

from sparsespec.errors import ConfigError

CODE_LINES_SCORED = 5  # the embedded code reference holds the next 5 lines; LongBench's holds 1


def qa_f1(text: str, reference: str) -> float:
    """LongBench's qa_f1_score: bag-of-words F1 after lowercasing and dropping punctuation and articles."""
    predicted, gold = _normalize(text).split(), _normalize(reference).split()
    common = sum((Counter(predicted) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def rouge_l(text: str, reference: str) -> float:
    """ROUGE-L F1 over lowercased whitespace tokens (longest common subsequence)."""
    predicted, gold = text.lower().split(), reference.lower().split()
    lcs = _lcs_length(predicted, gold)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(predicted), lcs / len(gold)
    return 2 * precision * recall / (precision + recall)


def code_similarity(text: str, reference: str) -> float:
    """Mean edit similarity of the generated lines against the reference lines, blank lines skipped
    and compared in order (a missing line scores 0). With a one-line reference this is LongBench's
    code_sim_score on the first generated line."""
    gold = [line.strip() for line in reference.splitlines() if line.strip()][:CODE_LINES_SCORED]
    predicted = [line.strip() for line in text.splitlines() if line.strip()]
    if not gold:
        return float(not predicted)
    ratios = [difflib.SequenceMatcher(None, p, g, autojunk=False).ratio() for p, g in zip(predicted, gold)]
    return sum(ratios) / len(gold)


def choice_accuracy(text: str, reference: str) -> float:
    """LongBench v2's extraction: 1.0 when 'The correct answer is (X)' names the reference letter."""
    match = re.search(r"The correct answer is \(?([A-D])\)?", text.replace("*", ""))
    return float(match is not None and match.group(1) == reference.strip())


def exact_match(text: str, reference: str) -> float:
    """The share of the reference's comma-separated items that `text` contains verbatim as whole
    words (case-insensitive): 1.0 only when every expected item is there. RULER's string_match_all,
    without counting a number found inside a longer one."""
    items = [item.strip() for item in reference.split(",") if item.strip()]
    if not items:
        return float(not text.strip())
    found = sum(re.search(rf"(?<!\w){re.escape(item)}(?!\w)", text, re.IGNORECASE) is not None for item in items)
    return found / len(items)


METRICS = {"qa_f1": qa_f1, "rouge_l": rouge_l, "code_sim": code_similarity, "choice": choice_accuracy,
           "exact_match": exact_match}
TASK_METRICS = {"qa": "qa_f1", "summarization": "rouge_l", "code": "code_sim",
                "retrieval": "exact_match"}  # the default metric per task


def score(task_or_metric: str, text: str, reference: str | Sequence[str] | None) -> float | None:
    """Score `text` with a metric (or a task's default metric); the best over several references.
    None when there is no reference (embedded summarization)."""
    metric = TASK_METRICS.get(task_or_metric, task_or_metric)
    if metric not in METRICS:
        raise ConfigError(f"unknown task or metric {task_or_metric!r}; accepted: "
                          f"{', '.join([*TASK_METRICS, *METRICS])}")
    if reference is None:
        return None
    references = [reference] if isinstance(reference, str) else list(reference)
    if not references:
        return None
    return max(METRICS[metric](text, r) for r in references)


def _normalize(text: str) -> str:
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def _lcs_length(a: list[str], b: list[str]) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]
