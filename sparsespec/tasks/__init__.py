"""Long-context prompts for the tasks, from an embedded offline corpus or a benchmark.

    prompts = load_prompts("qa", source="embedded", tokenizer=tok, context_tokens=2048, num_prompts=4)
    prompts[0].score(generated_text)

`retrieval` is the synthetic RULER-style family (sparsespec/tasks/retrieval.py), embedded only.
"""
from __future__ import annotations

from sparsespec.errors import ConfigError
from sparsespec.tasks.embedded import load_embedded
from sparsespec.tasks.longbench import load_longbench, load_longbench_v2
from sparsespec.tasks.prompts import Prompt
from sparsespec.tasks.retrieval import MIXED, check_options, load_retrieval
from sparsespec.tasks.scoring import score

TASKS = ("summarization", "qa", "code", "retrieval")
SOURCES = ("embedded", "longbench", "longbench_v2")
DEFAULT_MIN_FILL = 0.9  # a "60k" run must mean ~60K-token prompts, not whatever length a document happened to have

__all__ = ["Prompt", "load_prompts", "check_task_options", "score", "TASKS", "SOURCES", "DEFAULT_MIN_FILL"]


def load_prompts(task: str, *, source: str, tokenizer, context_tokens: int, num_prompts: int, seed: int = 0,
                 path: str | None = None, subset: str | None = None,
                 min_fill: float = DEFAULT_MIN_FILL, variant: str | None = None,
                 depth: float | None = None) -> list[Prompt]:
    """`num_prompts` prompts of at most `context_tokens` tokens (and at least `min_fill` of it), in
    the tokenizer's chat template where the task uses one. Deterministic for a given seed; prompt i
    does not depend on `num_prompts`.

    - source="embedded": Python's own docs and sources (offline); `path` and `subset` must be unset.
    - source="longbench": LongBench subsets (summarization gov_report/multi_news, qa narrativeqa/
      qasper/hotpotqa, code lcc/repobench-p); from the hub mirror, or a local file/folder in `path`.
    - source="longbench_v2": LongBench v2 (qa and code domains, multiple choice); hub or `path`.

    task="retrieval" (embedded only) takes `variant` (one family, or "mixed": each in turn; None:
    mixed) and `depth` (where the evidence sits, 0-1; None: 10%-90% in turn); other tasks take neither.
    """
    if task not in TASKS:
        raise ConfigError(f"task={task!r} is unknown; accepted: {', '.join(TASKS)}")
    if source not in SOURCES:
        raise ConfigError(f"task.source={source!r} is unknown; accepted: {', '.join(SOURCES)}")
    if not isinstance(context_tokens, int) or context_tokens <= 0:
        raise ConfigError(f"context_tokens={context_tokens!r} must be a positive integer")
    if not isinstance(num_prompts, int) or num_prompts <= 0:
        raise ConfigError(f"num_prompts={num_prompts!r} must be a positive integer")
    if not 0.0 <= min_fill <= 1.0:
        raise ConfigError(f"task.min_fill={min_fill!r} must be between 0 and 1")
    check_task_options(task, source, variant, depth)
    options = dict(tokenizer=tokenizer, context_tokens=context_tokens, num_prompts=num_prompts, seed=seed,
                   min_fill=min_fill)
    if source == "embedded":
        if path is not None or subset is not None:
            raise ConfigError("source=embedded reads Python's own docs and sources; task.path and task.subset "
                              "must be null")
        prompts = (load_retrieval(variant=variant or MIXED, depth=depth, **options) if task == "retrieval"
                   else load_embedded(task, **options))
    elif source == "longbench":
        prompts = load_longbench(task, path=path, subset=subset, **options)
    else:
        prompts = load_longbench_v2(task, path=path, subset=subset, **options)
    for prompt in prompts:
        prompt.meta.update(task=task, source=source, context_tokens=len(prompt.input_ids))
    return prompts


def check_task_options(task: str, source: str, variant: str | None, depth: float | None) -> None:
    """The retrieval task's own options, on the retrieval task only; it has no benchmark source."""
    if task != "retrieval":
        if variant is not None or depth is not None:
            raise ConfigError(f"task.variant and task.depth belong to task=retrieval, not task={task}; "
                              f"leave them null")
        return
    if source != "embedded":
        raise ConfigError(f"task.source={source!r} has no retrieval task; retrieval is generated offline: "
                          f"task.source=embedded")
    check_options(variant or MIXED, depth)
